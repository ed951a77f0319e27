//! The lazy filesystem itself, mounted for real: what was fsynced survives
//! a cut, what was not is gone, and a torn cut keeps a prefix in order.
//! Needs root and /dev/fuse; prints SKIPPED otherwise.

use std::io::Write;

use llmgw_chaos::powercut::LazyDisk;

fn mounted() -> Option<(tempfile::TempDir, LazyDisk)> {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !std::path::Path::new("/dev/fuse").exists() {
        llmgw_test_kit::skipped("power-cut filesystem", "needs root and /dev/fuse");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = LazyDisk::mount(&dir.path().join("mnt"), &dir.path().join("backing"))
        .unwrap_or_else(|e| panic!("{e}"));
    Some((dir, disk))
}

#[test]
fn synced_data_survives_a_cut_and_unsynced_data_does_not() {
    let Some((_dir, disk)) = mounted() else {
        return;
    };
    let path = disk.mountpoint().join("wal.log");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(b"acknowledged|").unwrap();
    file.sync_data().unwrap();
    file.write_all(b"in flight").unwrap();
    let other = disk.mountpoint().join("new-file");
    std::fs::write(&other, b"never synced").unwrap();
    drop(file);
    assert_eq!(std::fs::read(&path).unwrap(), b"acknowledged|in flight");
    let report = disk.cut(None).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"acknowledged|");
    assert_eq!(std::fs::read(&other).unwrap(), b"", "{report:?}");
    assert_eq!(report.files, 2);
}

#[test]
fn a_torn_cut_keeps_a_prefix_of_the_unsynced_tail() {
    let Some((_dir, disk)) = mounted() else {
        return;
    };
    let path = disk.mountpoint().join("000004.log");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(b"synced|").unwrap();
    file.sync_all().unwrap();
    file.write_all(b"0123456789").unwrap();
    drop(file);
    // A rename keeps the undo log with the file.
    let renamed = disk.mountpoint().join("000005.log");
    std::fs::rename(&path, &renamed).unwrap();
    let report = disk.cut(Some(&mut |total| total / 2)).unwrap();
    assert_eq!(std::fs::read(&renamed).unwrap(), b"synced|01234");
    assert_eq!(report.torn.as_ref().map(|t| (t.1, t.2)), Some((5, 10)));
}
