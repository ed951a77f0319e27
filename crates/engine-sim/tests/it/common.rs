//! Harness: start the real simulator binary on 127.0.0.1 with free ports,
//! talk raw HTTP/1.1 to it, and wait for conditions with generous deadlines.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

pub use llmgw_test_kit::process::alive;
pub use llmgw_test_kit::{free_port, metric, wait_until_blocking};

pub const BIN: &str = env!("CARGO_BIN_EXE_llmgw-engine-sim");
pub const SMALL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// Every persona the conformance scenarios run against.
pub const PERSONAS: &[&str] = &[
    "vllm=0.11.0",
    "vllm=0.34.0",
    "sglang=0.5.10",
    "sglang=0.5.23",
];

pub fn is_vllm(persona: &str) -> bool {
    persona.starts_with("vllm")
}

/// A running simulator process with its output captured in files.
pub struct Sim {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    status: Option<ExitStatus>,
}

/// The argv of a persona serving `model` on `port`.
pub fn engine_args(persona: &str, model: &str, port: u16) -> Vec<String> {
    let port = port.to_string();
    let mut args: Vec<String> = if is_vllm(persona) {
        vec![
            "serve".into(),
            model.into(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port,
        ]
    } else {
        vec![
            "-m".into(),
            "sglang.launch_server".into(),
            "--model-path".into(),
            model.into(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port,
        ]
    };
    args.push(format!("--sim-persona={persona}"));
    args
}

impl Sim {
    /// Starts the binary with `args`; fast pace unless `env` says otherwise.
    pub fn spawn(args: &[String], env: &[(&str, &str)], port: u16) -> Sim {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = std::fs::File::create(dir.path().join("stdout")).expect("stdout file");
        let err = std::fs::File::create(dir.path().join("stderr")).expect("stderr file");
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_remove("LLMGW_SIM_PERSONA")
            .env_remove("LLMGW_SIM_FAULT")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env("LLMGW_SIM_LOAD_TIME", "300ms")
            .env("LLMGW_SIM_TTFT", "5ms")
            .env("LLMGW_SIM_ITL", "2ms")
            .env("LLMGW_SIM_SEED", "7")
            .env("RAY_TMPDIR", dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start llmgw-engine-sim");
        Sim {
            child,
            port,
            dir,
            status: None,
        }
    }

    /// Starts a persona serving `model` with extra flags.
    pub fn start(persona: &str, model: &str, extra: &[&str], env: &[(&str, &str)]) -> Sim {
        let port = free_port();
        let mut args = engine_args(persona, model, port);
        args.extend(extra.iter().map(|s| s.to_string()));
        Sim::spawn(&args, env, port)
    }

    /// Starts and waits until `/health` answers 200.
    pub fn ready(persona: &str, model: &str, extra: &[&str], env: &[(&str, &str)]) -> Sim {
        let mut sim = Sim::start(persona, model, extra, env);
        sim.wait_healthy();
        sim
    }

    pub fn wait_healthy(&mut self) {
        let port = self.port;
        let ok = wait_until_blocking(
            Duration::from_secs(30),
            || matches!(get(port, "/health"), Some(r) if r.status == 200),
        );
        if !ok {
            panic!(
                "simulator on {} never became healthy; stderr:\n{}\nstdout:\n{}",
                self.port,
                self.stderr(),
                self.stdout()
            );
        }
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    pub fn output(&self) -> String {
        format!("{}{}", self.stdout(), self.stderr())
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to end; `None` if it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        if self.status.is_some() {
            return self.status;
        }
        let child = &mut self.child;
        let mut status = None;
        wait_until_blocking(limit, || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
        self.status = status;
        status
    }

    pub fn metric(&self, name: &str) -> Option<f64> {
        metric_value(self.port, name)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if self.status.is_none() {
            // The whole group: the simulator and its worker children.
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{}", self.pid())])
                .status();
            let _ = self.child.wait();
        }
    }
}

/// Exit code or signal, for messages.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown".into(),
    }
}

/// A response read to the end of its body (or until the server cut it).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// False when the connection ended before the body was complete.
    pub complete: bool,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of an event stream, in order.
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// Sends one request over a fresh connection and reads the whole reply.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<Reply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body.as_bytes()).ok()?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if !chunked {
        let len: Option<usize> = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok());
        let complete = len.is_none_or(|l| rest.len() >= l);
        return Some(Reply {
            status,
            headers,
            body: rest.to_string(),
            complete,
        });
    }
    let mut body = String::new();
    let mut remaining = rest;
    let mut complete = false;
    while let Some((size_line, after)) = remaining.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size_line.trim(), 16) else {
            break;
        };
        if size == 0 {
            complete = true;
            break;
        }
        if after.len() < size {
            body.push_str(after);
            break;
        }
        body.push_str(&after[..size]);
        remaining = after[size..].strip_prefix("\r\n").unwrap_or(&after[size..]);
    }
    Some(Reply {
        status,
        headers,
        body,
        complete,
    })
}

pub fn get(port: u16, path: &str) -> Option<Reply> {
    request(port, "GET", path, &[], "")
}

pub fn post(port: u16, path: &str, body: &str) -> Option<Reply> {
    request(port, "POST", path, &[], body)
}

pub fn metric_value(port: u16, name: &str) -> Option<f64> {
    metric(&get(port, "/metrics")?.body, name)
}

/// True when nothing listens on the port (connection refused).
pub fn refused(port: u16) -> bool {
    matches!(TcpStream::connect(("127.0.0.1", port)), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// Replaces what changes between runs (pids, clocks) in engine output.
pub fn normalise(line: &str) -> String {
    let mut out = line.to_string();
    for key in ["pid=", "port="] {
        let mut replaced = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(key) {
            replaced.push_str(&rest[..i + key.len()]);
            rest = rest[i + key.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
            replaced.push('N');
        }
        replaced.push_str(rest);
        out = replaced;
    }
    let bytes: Vec<char> = out.chars().collect();
    let mut result = String::new();
    let mut i = 0;
    while i < bytes.len() {
        // vLLM: `MM-DD HH:MM:SS`; SGLang: `YYYY-MM-DD HH:MM:SS`.
        let window: String = bytes[i..bytes.len().min(i + 19)].iter().collect();
        if is_stamp(&window, "dddd-dd-dd dd:dd:dd") {
            result.push_str("YYYY-MM-DD hh:mm:ss");
            i += 19;
            continue;
        }
        let short: String = bytes[i..bytes.len().min(i + 14)].iter().collect();
        if is_stamp(&short, "dd-dd dd:dd:dd") {
            result.push_str("MM-DD hh:mm:ss");
            i += 14;
            continue;
        }
        result.push(bytes[i]);
        i += 1;
    }
    result
}

fn is_stamp(text: &str, pattern: &str) -> bool {
    text.len() == pattern.len()
        && text
            .chars()
            .zip(pattern.chars())
            .all(|(c, p)| if p == 'd' { c.is_ascii_digit() } else { c == p })
}

/// Compares the last lines of `output` with a golden file; with
/// `LLMGW_UPDATE_GOLDEN=1` writes the file instead.
pub fn assert_golden_tail(name: &str, output: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let lines: Vec<String> = output.lines().map(normalise).collect();
    if std::env::var("LLMGW_UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        let tail_len = lines.len().min(12);
        std::fs::write(&path, lines[lines.len() - tail_len..].join("\n") + "\n")
            .expect("write golden");
        return;
    }
    let golden = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("golden file {}: {e}", path.display()));
    let expected: Vec<&str> = golden.lines().collect();
    assert!(
        lines.len() >= expected.len(),
        "output shorter than golden {name}:\n{output}"
    );
    let actual = &lines[lines.len() - expected.len()..];
    for (a, e) in actual.iter().zip(&expected) {
        assert_eq!(a, e, "golden {name} differs; full output:\n{output}");
    }
}

pub fn chat_body(model: &str, max_tokens: u32, stream: bool, extra: &str) -> String {
    format!(
        "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Tell me about foxes\"}}],\"max_tokens\":{max_tokens},\"stream\":{stream}{extra}}}"
    )
}

/// Children of `pid`, as (pid, command line).
pub fn children(pid: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let Some(after) = stat.rsplit_once(')').map(|(_, a)| a.to_string()) else {
            continue;
        };
        let ppid: i32 = after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid == pid {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            out.push((child, cmd));
        }
    }
    out
}
