//! Just enough DER to read a certificate's validity for log lines; the
//! security decisions are rustls-webpki's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
            let yy: i64 = text[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &text[2..])
        }
        0x18 if text.len() == 14 => (text[..4].parse().ok()?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let days = days_from_civil(year, field(0)?, field(2)?);
    let seconds = days * 86_400 + field(4)? * 3600 + field(6)? * 60 + field(8)?;
    if seconds >= 0 {
        Some(UNIX_EPOCH + Duration::from_secs(seconds.unsigned_abs()))
    } else {
        Some(UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs()))
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn format_time(at: SystemTime) -> String {
    let secs = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Inverse of days_from_civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
