//! Just enough ZMTP 3.0 (the ZeroMQ wire protocol, NULL security) to talk
//! to the engines' PUB and ROUTER sockets and to play them: the greeting,
//! the READY handshake, and multipart messages of length-prefixed frames.
//! llmgw speaks 3.0 so that libzmq peers send subscriptions as messages.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A frame larger than this ends the connection: a KV batch is a few
/// hundred kilobytes at most, and a peer must not make us allocate more.
pub const MAX_FRAME: u64 = 64 << 20;

const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    Pub,
    Sub,
    Router,
    Dealer,
}

impl SocketType {
    fn name(self) -> &'static str {
        match self {
            SocketType::Pub => "PUB",
            SocketType::Sub => "SUB",
            SocketType::Router => "ROUTER",
            SocketType::Dealer => "DEALER",
        }
    }
}

/// One ZMTP connection after its handshake.
pub struct Connection {
    stream: TcpStream,
    /// The socket type the peer announced.
    pub peer: String,
}

/// What arrives on a connection: a message (its frames), or a command
/// (name and body) such as a ZMTP 3.1 SUBSCRIBE.
pub enum Incoming {
    Message(Vec<Vec<u8>>),
    Command { name: String, body: Vec<u8> },
}

fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3; // major
    g[11] = 0; // minor
    g[12..16].copy_from_slice(b"NULL");
    g
}

fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl Connection {
    /// Greets the peer and exchanges READY commands.
    pub async fn handshake(mut stream: TcpStream, own: SocketType) -> io::Result<Connection> {
        stream.set_nodelay(true)?;
        stream.write_all(&greeting()).await?;
        let mut theirs = [0u8; 64];
        stream.read_exact(&mut theirs).await?;
        if theirs[0] != 0xFF || theirs[9] != 0x7F {
            return Err(protocol_error("the peer does not speak ZMTP"));
        }
        if theirs[10] < 3 {
            return Err(protocol_error(format!(
                "the peer speaks ZMTP {}, llmgw needs 3 or later",
                theirs[10]
            )));
        }
        if &theirs[12..16] != b"NULL" {
            return Err(protocol_error(
                "the peer wants a security mechanism other than NULL",
            ));
        }
        let mut ready = Vec::new();
        ready.push(5);
        ready.extend_from_slice(b"READY");
        property(&mut ready, "Socket-Type", own.name().as_bytes());
        if matches!(own, SocketType::Dealer | SocketType::Router) {
            property(&mut ready, "Identity", b"");
        }
        let mut conn = Connection {
            stream,
            peer: String::new(),
        };
        conn.write_frame(&ready, COMMAND).await?;
        conn.stream.flush().await?;
        match conn.read_frame().await? {
            (flags, body) if flags & COMMAND != 0 => {
                let (name, props) = command_parts(&body)?;
                if name != "READY" {
                    return Err(protocol_error(format!("expected READY, got {name}")));
                }
                conn.peer = socket_type_of(props).unwrap_or_default();
            }
            _ => return Err(protocol_error("expected the READY command")),
        }
        Ok(conn)
    }

    pub async fn connect(addr: &str, own: SocketType) -> io::Result<Connection> {
        let stream = TcpStream::connect(addr).await?;
        Connection::handshake(stream, own).await
    }

    async fn write_frame(&mut self, body: &[u8], flags: u8) -> io::Result<()> {
        if body.len() > 255 {
            self.stream.write_u8(flags | LONG).await?;
            self.stream.write_u64(body.len() as u64).await?;
        } else {
            self.stream.write_u8(flags).await?;
            self.stream.write_u8(body.len() as u8).await?;
        }
        self.stream.write_all(body).await
    }

    async fn read_frame(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let flags = self.stream.read_u8().await?;
        let size = if flags & LONG != 0 {
            self.stream.read_u64().await?
        } else {
            u64::from(self.stream.read_u8().await?)
        };
        if size > MAX_FRAME {
            return Err(protocol_error(format!(
                "a frame of {size} bytes is over the {MAX_FRAME}-byte bound"
            )));
        }
        let mut body = vec![0u8; size as usize];
        self.stream.read_exact(&mut body).await?;
        Ok((flags, body))
    }

    /// Sends one multipart message.
    pub async fn send(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        for (i, frame) in frames.iter().enumerate() {
            let more = if i + 1 < frames.len() { MORE } else { 0 };
            self.write_frame(frame, more).await?;
        }
        self.stream.flush().await
    }

    /// Receives one message or command.
    pub async fn recv(&mut self) -> io::Result<Incoming> {
        let mut frames = Vec::new();
        loop {
            let (flags, body) = self.read_frame().await?;
            if flags & COMMAND != 0 {
                let (name, rest) = command_parts(&body)?;
                return Ok(Incoming::Command {
                    name: name.to_string(),
                    body: rest.to_vec(),
                });
            }
            frames.push(body);
            if flags & MORE == 0 {
                return Ok(Incoming::Message(frames));
            }
        }
    }
}

fn property(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value);
}

fn command_parts(body: &[u8]) -> io::Result<(&str, &[u8])> {
    let len = *body
        .first()
        .ok_or_else(|| protocol_error("an empty command"))? as usize;
    let name = body
        .get(1..1 + len)
        .and_then(|n| std::str::from_utf8(n).ok())
        .ok_or_else(|| protocol_error("a command with a bad name"))?;
    Ok((name, &body[1 + len..]))
}

fn socket_type_of(mut props: &[u8]) -> Option<String> {
    while let Some((&len, rest)) = props.split_first() {
        let name = rest.get(..len as usize)?;
        let rest = &rest[len as usize..];
        let value_len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let value = rest.get(4..4 + value_len)?;
        if name.eq_ignore_ascii_case(b"Socket-Type") {
            return String::from_utf8(value.to_vec()).ok();
        }
        props = &rest[4 + value_len..];
    }
    None
}
