//! Just enough DER to read a certificate's validity for log lines; the
//! security decisions are rustls-webpki's.

use std::time::SystemTime;

use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// One TLV: (tag, contents, rest).
fn next(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// (notBefore, notAfter) of a DER certificate.
pub(crate) fn validity(cert: &[u8]) -> Option<(SystemTime, SystemTime)> {
    const SEQUENCE: u8 = 0x30;
    let (tag, certificate, _) = next(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = next(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut rest = tbs;
    let (tag, _, after) = next(rest)?;
    if tag == 0xa0 {
        // [0] version
        rest = after;
    }
    // serial, signature algorithm, issuer
    for _ in 0..3 {
        rest = next(rest)?.2;
    }
    let (tag, validity, _) = next(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (before_tag, before, rest) = next(validity)?;
    let (after_tag, after, _) = next(rest)?;
    Some((time(before_tag, before)?, time(after_tag, after)?))
}

/// UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn time(tag: u8, text: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 if text.len() == 12 => {
            let yy: i32 = text[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &text[2..])
        }
        0x18 if text.len() == 14 => (text[..4].parse().ok()?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| -> Option<u8> { rest.get(i..i + 2)?.parse().ok() };
    let month = Month::try_from(field(0)?).ok()?;
    let date = Date::from_calendar_date(year, month, field(2)?).ok()?;
    let time = Time::from_hms(field(4)?, field(6)?, field(8)?).ok()?;
    Some(PrimitiveDateTime::new(date, time).assume_utc().into())
}

/// `YYYY-MM-DDTHH:MM:SSZ`, whole seconds as certificates carry them.
pub(crate) fn format_time(at: SystemTime) -> String {
    let at = OffsetDateTime::from(at)
        .replace_nanosecond(0)
        .expect("0 is a valid nanosecond");
    at.format(&Rfc3339)
        .unwrap_or_else(|_| format!("{} s after the Unix epoch", at.unix_timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn times_convert_both_ways() {
        let at = time(0x17, b"240229123456Z").unwrap();
        assert_eq!(format_time(at), "2024-02-29T12:34:56Z");
        let at = time(0x18, b"20991231235959Z").unwrap();
        assert_eq!(format_time(at), "2099-12-31T23:59:59Z");
        assert_eq!(format_time(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert!(time(0x17, b"2402291234Z").is_none());
    }
}
