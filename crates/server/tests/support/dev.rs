//! `llmgw dev` as a test runs it: started in its own process group with
//! its output in `<work>/dev.out`, stopped with SIGTERM to the group when
//! dropped, and any engine an agent recorded killed after.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Dev {
    child: std::process::Child,
    work: PathBuf,
}

impl Dev {
    /// Starts `llmgw dev --work-dir WORK --port <free>` with `args`.
    pub fn start(work: &Path, args: &[&str]) -> Dev {
        let log = std::fs::File::create(work.join("dev.out")).unwrap();
        let router_port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string();
        let child = std::process::Command::new(super::llmgw_bin())
            .arg("dev")
            .args(args)
            .args(["--port", &router_port, "--work-dir"])
            .arg(work)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start llmgw dev");
        Dev {
            child,
            work: work.to_owned(),
        }
    }

    /// What `llmgw dev` printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(self.work.join("dev.out")).unwrap_or_default()
    }

    /// Waits until `llmgw dev` printed `needle`; panics with its output after
    /// `within`.
    pub async fn wait_printed(&self, needle: &str, within: Duration) {
        let started = Instant::now();
        while !self.output().contains(needle) {
            assert!(
                started.elapsed() < within,
                "llmgw dev did not print {needle:?} within {within:?}:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn kill_engines(&self) {
        let Ok(entries) = std::fs::read_dir(&self.work) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && entry.file_name().to_string_lossy().starts_with("agent-") {
                for group in llmgw_dev::engine_groups(&path) {
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", "--", &format!("-{group}")])
                        .status();
                }
            }
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = std::process::Command::new("kill")
            .args(["-TERM", "--", &group])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.kill_engines();
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
        let _ = self.child.wait();
        self.kill_engines();
    }
}
