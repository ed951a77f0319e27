//! `llmgw dev` as a test runs it: in its own process group with its
//! output in `<work>/dev.out`; stopped with SIGTERM to the group when
//! dropped, and then every process `dev.json` names and every engine an
//! agent recorded is killed, so nothing outlives a failed test.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use llmgw_dev::DevFile;

use crate::process::{alive, signal_group, signal_pid};
use crate::{free_port, llmgw_bin, wait_until_blocking};

pub struct Dev {
    child: Child,
    work: PathBuf,
    /// The port of the OpenAI router `llmgw dev` was told to serve on.
    pub router_port: u16,
}

impl Dev {
    /// Starts `llmgw dev ARGS --port <free> --work-dir WORK`.
    pub fn start(work: &Path, args: &[&str]) -> Dev {
        std::fs::create_dir_all(work).expect("the work directory");
        let log = std::fs::File::create(work.join("dev.out")).expect("dev.out");
        let router_port = free_port();
        let child = Command::new(llmgw_bin())
            .arg("dev")
            .args(args)
            .args(["--port", &router_port.to_string(), "--work-dir"])
            .arg(work)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dev.out"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start llmgw dev");
        Dev {
            child,
            work: work.to_owned(),
            router_port,
        }
    }

    /// What `llmgw dev` printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(self.work.join("dev.out")).unwrap_or_default()
    }

    /// Waits until `llmgw dev` printed `needle`; fails the test with its
    /// output after `within`.
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

    /// `dev.json`, once `llmgw dev` wrote it.
    pub fn dev_file(&self) -> Option<DevFile> {
        let bytes = std::fs::read(self.work.join("dev.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// `llmgw dev`'s own pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("a pid fits an i32")
    }

    /// SIGINT to `llmgw dev` alone (Ctrl-C in a terminal signals the
    /// whole group): it must stop every child itself.
    pub fn interrupt(&self) {
        signal_pid(self.pid(), libc::SIGINT);
    }

    /// Waits for `llmgw dev` to exit; false if it still runs after
    /// `within`.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let child = &mut self.child;
        wait_until_blocking(within, || matches!(child.try_wait(), Ok(Some(_))))
    }

    /// Every process `dev.json` names and every engine group an agent
    /// recorded in its state files.
    pub fn pids(&self) -> Vec<i32> {
        let mut out: Vec<i32> = self
            .dev_file()
            .into_iter()
            .flat_map(|dev| dev.processes)
            .filter_map(|p| i32::try_from(p.pid).ok())
            .collect();
        for entry in std::fs::read_dir(&self.work)
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry.file_name().to_string_lossy().starts_with("agent-") {
                out.extend(llmgw_dev::engine_groups(&entry.path()));
            }
        }
        out
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let left = self.pids();
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            signal_group(self.pid(), libc::SIGTERM);
            if !self.wait_exit(Duration::from_secs(15)) {
                signal_group(self.pid(), libc::SIGKILL);
                let _ = self.child.wait();
            }
        }
        // Engines run in sessions of their own, and a `llmgw dev` that
        // died first left its children behind.
        for pid in left.into_iter().chain(self.pids()) {
            if alive(pid) {
                signal_group(pid, libc::SIGKILL);
                signal_pid(pid, libc::SIGKILL);
            }
        }
    }
}

/// The pid of peer `id`, from dev.json.
pub fn peer_pid(dev_file: &DevFile, id: u64) -> i32 {
    dev_file
        .processes
        .iter()
        .find(|p| p.role == "server" && p.id.as_u64() == Some(id))
        .map(|p| i32::try_from(p.pid).expect("a pid fits an i32"))
        .unwrap_or_else(|| panic!("dev.json names no process for peer {id}"))
}

/// The admin API of a `llmgw dev` cluster as an operator reaches it: HTTPS
/// with the dev CA and the tokens dev.json names. Each call tries the
/// peers in turn, so one that is down is passed over.
pub struct DevAdmin {
    http: reqwest::Client,
    apis: Vec<String>,
    read_token: String,
    write_token: String,
}

impl DevAdmin {
    pub fn new(dev_file: &DevFile) -> DevAdmin {
        let token = |file: &Option<String>| {
            let file = file.as_deref().expect("dev.json names its token files");
            std::fs::read_to_string(file)
                .unwrap_or_else(|e| panic!("{file}: {e}"))
                .trim()
                .to_owned()
        };
        DevAdmin {
            http: crate::admin_client(dev_file.ca.as_deref().map(Path::new)),
            apis: dev_file.api.clone(),
            read_token: token(&dev_file.read_token_file),
            write_token: token(&dev_file.write_token_file),
        }
    }

    /// `GET path` read as `T` from the first peer that answers 200.
    pub async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        let mut seen = Vec::new();
        for api in &self.apis {
            let url = format!("{api}{path}");
            match crate::get_json(&self.http, &url, Some(&self.read_token)).await {
                Ok(value) => return Ok(value),
                Err(why) => seen.push(why),
            }
        }
        Err(seen.join("; "))
    }

    /// A write with the write token: the status and body of the first
    /// peer that answers at all.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, serde_json::Value), String> {
        let mut seen = Vec::new();
        for api in &self.apis {
            let url = format!("{api}{path}");
            let mut request = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.write_token);
            if let Some(body) = &body {
                request = request
                    .header("content-type", "application/json")
                    .body(body.clone());
            }
            match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let text = response.text().await.unwrap_or_default();
                    let value =
                        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
                    return Ok((status, value));
                }
                Err(e) => seen.push(format!("{method} {url}: {e}")),
            }
        }
        Err(seen.join("; "))
    }
}
