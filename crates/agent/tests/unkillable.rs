//! An engine that SIGKILL cannot end: one of its threads waits in the
//! kernel for an answer that never comes, as a thread stuck in a GPU driver
//! call does. Here a FUSE filesystem that never answers an `open` holds the
//! engine while it reads its model's `config.json`. The shard must end as
//! failed, naming the processes that hold on, and keep its GPUs and port
//! reserved until they are really gone.
//!
//! Needs root and /dev/fuse (mounted through `fusermount3`); prints SKIPPED
//! otherwise.

mod support;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{FileAttr, FileType, Filesystem, ReplyAttr, ReplyEntry, ReplyOpen, Request};
use llmgw_agent::group_members;
use llmgw_catalog::Engine;
use llmgw_proto::agent::ShardState;
use llmgw_test_kit::{free_port, wait_until};
use support::*;

const LONG: Duration = Duration::from_secs(60);
const ROOT: u64 = 1;
const MODEL_DIR: u64 = 2;
const CONFIG: u64 = 3;

/// `/model/config.json`, whose `open` is answered only once released.
struct HangingModel {
    released: Arc<(Mutex<bool>, Condvar)>,
    asked: Arc<AtomicBool>,
}

fn attr(ino: u64) -> FileAttr {
    let dir = ino != CONFIG;
    FileAttr {
        ino,
        size: if dir { 0 } else { 64 },
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o644 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for HangingModel {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match (parent, name.to_str()) {
            (ROOT, Some("model")) => reply.entry(&Duration::ZERO, &attr(MODEL_DIR), 0),
            (MODEL_DIR, Some("config.json")) => reply.entry(&Duration::ZERO, &attr(CONFIG), 0),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyAttr) {
        match ino {
            ROOT | MODEL_DIR | CONFIG => reply.attr(&Duration::ZERO, &attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        // The opener now waits in the kernel; once this request has been
        // read here, not even SIGKILL ends that wait (a signal only moves
        // it from an interruptible wait to one that nothing interrupts).
        self.asked.store(true, Ordering::SeqCst);
        let (lock, changed) = &*self.released;
        let mut released = lock.lock().unwrap();
        while !*released {
            released = changed.wait(released).unwrap();
        }
        reply.error(libc::EIO);
    }
}

/// The mounted filesystem; releasing it answers the waiting `open`.
struct Mounted {
    released: Arc<(Mutex<bool>, Condvar)>,
    /// The engine has asked for its model's `config.json`.
    asked: Arc<AtomicBool>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl Mounted {
    fn mount(dir: &Path) -> Option<Mounted> {
        // SAFETY: geteuid has no preconditions.
        #[allow(unsafe_code)]
        let root = unsafe { libc::geteuid() } == 0;
        if !root || !Path::new("/dev/fuse").exists() {
            llmgw_test_kit::skipped("engines that outlive SIGKILL", "needs root and /dev/fuse");
            return None;
        }
        let mountpoint = dir.join("models");
        std::fs::create_dir_all(&mountpoint).unwrap();
        let released = Arc::new((Mutex::new(false), Condvar::new()));
        let asked = Arc::new(AtomicBool::new(false));
        let filesystem = HangingModel {
            released: Arc::clone(&released),
            asked: Arc::clone(&asked),
        };
        let options = [
            fuser::MountOption::FSName("llmgw-hanging-model".to_owned()),
            fuser::MountOption::AllowOther,
        ];
        let session = fuser::spawn_mount2(filesystem, &mountpoint, &options)
            .unwrap_or_else(|e| panic!("mounting on {}: {e}", mountpoint.display()));
        Some(Mounted {
            released,
            asked,
            mountpoint,
            session: Some(session),
        })
    }

    fn model_dir(&self) -> String {
        self.mountpoint.join("model").display().to_string()
    }

    fn release(&self) {
        let (lock, changed) = &*self.released;
        *lock.lock().unwrap() = true;
        changed.notify_all();
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.release();
        drop(self.session.take());
    }
}

/// A start of `shard` on GPU 0 is refused because the survivors of shard
/// `stuck` hold it.
fn gpu_0_is_refused(h: &mut Harness, shard: &str) {
    let outcome = h.start(spec(shard, Engine::Vllm, &[0], free_port()));
    assert!(!outcome.accepted, "{}", outcome.message);
    assert!(
        outcome
            .message
            .contains("GPU 0 is in use by shard stuck, which ended but whose processes"),
        "{}",
        outcome.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_outlives_sigkill_fails_its_shard_and_keeps_its_gpus() {
    let models = tempfile::tempdir().unwrap();
    let Some(fs) = Mounted::mount(models.path()) else {
        return;
    };
    let setup = NodeSetup {
        stop_timeout: Duration::from_secs(1),
        ..NodeSetup::default()
    };
    let mut h = Harness::new(&setup);
    let port = free_port();
    let mut stuck = spec("stuck", Engine::Vllm, &[0], port);
    stuck.source = fs.model_dir();
    assert!(h.start(stuck).accepted);
    let pgid = h.supervisor.pids("stuck")[0];
    assert!(
        wait_until(LONG, || async { fs.asked.load(Ordering::SeqCst) }).await,
        "the engine never asked for its model"
    );

    assert!(h.supervisor.stop("stuck", "moved elsewhere").accepted);
    let failed = h.wait_for("stuck", ShardState::Failed, LONG).await;
    assert!(
        failed
            .message
            .contains(&format!("pid {pgid} (state D, uninterruptible sleep")),
        "{}",
        failed.message
    );
    assert!(
        failed.message.contains(&format!(
            "survived SIGKILL: GPU(s) 0 and port {port} stay reserved on this node"
        )),
        "{}",
        failed.message
    );
    assert!(
        !h.states("stuck").contains(&ShardState::Stopped),
        "{:?}",
        h.states("stuck")
    );

    // Its GPU and its port are not handed to another shard meanwhile, and
    // the heartbeat tells the leader not to place on the GPU.
    gpu_0_is_refused(&mut h, "same-gpu");
    assert_eq!(h.supervisor.survivor_gpus(), vec![0]);
    let same_port = h.start(spec("same-port", Engine::Vllm, &[1], port));
    assert!(!same_port.accepted);
    assert!(
        same_port
            .message
            .contains(&format!("port {port} is in use by shard stuck")),
        "{}",
        same_port.message
    );

    // The state file stays while they run: an agent restarted meanwhile
    // finds them, finishes the stop itself and keeps the GPU reserved.
    let adoptions = h.restart(&setup);
    assert!(
        matches!(
            adoptions.as_slice(),
            [llmgw_agent::Adoption::Adopted { .. }]
        ),
        "{adoptions:?}"
    );
    let again = h.wait_for("stuck", ShardState::Failed, LONG).await;
    assert!(
        again.message.contains("survived SIGKILL") && again.message.contains("restarted agent"),
        "{}",
        again.message
    );
    gpu_0_is_refused(&mut h, "same-gpu-again");
    assert_eq!(h.supervisor.survivor_gpus(), vec![0]);

    // The kernel lets go: the engine ends, its state file goes, and the
    // GPU is free again.
    fs.release();
    assert!(
        wait_until(LONG, || async { group_members(pgid).is_empty() }).await,
        "the engine outlived its release"
    );
    let dir = h.dir.path().to_owned();
    assert!(
        wait_until(LONG, || {
            let left = llmgw_agent::read_state_files(&dir).len();
            async move { left == 0 }
        })
        .await,
        "the state file outlived the processes"
    );
    assert!(h.supervisor.survivor_gpus().is_empty());
    let after = h.start(spec("after", Engine::Vllm, &[0], free_port()));
    assert!(after.accepted, "{}", after.message);
    h.wait_for("after", ShardState::Ready, LONG).await;
}
