//! The deployment files that are not run here are checked with the tools
//! their users have: systemd units with `systemd-analyze verify`, alert
//! rules with `promtool` (and their unit tests), Kubernetes manifests with
//! `kubernetes-validate --strict` against the schemas, and every config
//! they carry with `llmgw config check` (scripts/check-deploy).

use std::path::Path;
use std::process::Command;

#[test]
fn systemd_units_kubernetes_manifests_and_alert_rules_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/check-deploy"))
        .arg(env!("CARGO_BIN_EXE_llmgw"))
        .output()
        .expect("run scripts/check-deploy");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "scripts/check-deploy failed:\n{text}");
    let systemd_skipped = text.contains("SKIPPED: systemd-analyze");
    for checked in [
        "SUCCESS: 10 rules found",
        "metric names used by the dashboard and alerts, all exported",
        "configs from the ConfigMaps",
        "compose configs",
    ] {
        assert!(text.contains(checked), "no {checked:?} in:\n{text}");
    }
    assert!(
        systemd_skipped || text.contains("systemd-analyze verify: "),
        "{text}"
    );
}
