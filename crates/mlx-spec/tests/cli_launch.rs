//! `mlx-spec launch` and `distributed-check`: real rank processes over the
//! ring backend on loopback, bounded, and their failures.

mod common;

use common::{mlx_spec_env as mlx_spec, processes_marked, text};

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
#[test]
fn local_ranks_form_a_group_and_only_rank_0_reports() {
    for n in ["2", "3"] {
        let (out, _) = mlx_spec(&["launch", "--np", n, "--", "distributed-check"], &[]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{n} ranks: {}", text(&out.stderr));
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
        assert!(
            stdout.contains(&format!(
                "group of {n} rank(s) over ring: all_sum and relay ok"
            )),
            "{stdout}"
        );
    }
}

#[test]
fn a_rank_that_dies_stops_every_other_rank_and_is_named() {
    let mark = format!("dies-{}", std::process::id());
    let (out, took) = mlx_spec(
        &[
            "launch",
            "--np",
            "3",
            "--",
            "distributed-check",
            "--exit-rank",
            "1",
        ],
        &[("MLX_SPEC_TEST_MARK", &mark)],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rank 1 (exit status: 3)") && stderr.contains("stopped every other rank"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert_eq!(
        processes_marked(&mark),
        Vec::<String>::new(),
        "orphaned ranks"
    );
}

#[test]
fn a_rank_that_never_starts_is_named_within_the_join_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hostfile = dir.path().join("ring.json");
    let ring = mlx_distributed::Hostfile::loopback(2).expect("ports");
    ring.write(&hostfile).expect("write");
    let (out, took) = mlx_spec(
        &["distributed-check"],
        &[
            ("MLX_RANK", "0"),
            ("MLX_HOSTFILE", hostfile.to_str().expect("utf-8")),
            ("MLX_SPEC_JOIN_TIMEOUT", "3"),
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("not listening: rank 1 ({})", ring.ranks[1][0])),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
}

fn hosts_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("hosts.json");
    std::fs::write(
        &path,
        r#"[{"ssh": "node-a", "ips": ["127.0.0.1"]}, {"ssh": "node-b", "ips": ["127.0.0.1"]}]"#,
    )
    .expect("write");
    path
}

#[test]
fn a_hostfile_of_machines_prints_each_rank_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = hosts_file(dir.path());
    let (out, _) = mlx_spec(
        &[
            "launch",
            "--hosts",
            hosts.to_str().expect("utf-8"),
            "--starting-port",
            "40100",
            "--",
            "generate",
            "--prompt",
            "it's",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains(r#"[["127.0.0.1:40100"],["127.0.0.1:40101"]]"#),
        "{stdout}"
    );
    for (rank, host) in [(0, "node-a"), (1, "node-b")] {
        assert!(
            stdout.contains(&format!("# rank {rank} on {host}:")),
            "{stdout}"
        );
        // The hostfile goes to a private directory, not a fixed /tmp path.
        assert!(
            stdout.contains(&format!(
                "MLX_RANK={rank} MLX_HOSTFILE=\"$d/ring.json\" MLX_SPEC_HOSTFILE_DIR=\"$d\""
            )),
            "{stdout}"
        );
    }
    assert!(!stdout.contains("/tmp/mlx-spec-ring.json"), "{stdout}");
    assert!(stdout.contains("d=$(mktemp -d)"), "{stdout}");
    // The secret reaches each rank on its stdin, never its command line.
    let secret = stdout
        .lines()
        .find_map(|l| {
            l.rsplit_once("(paste this line): ")
                .map(|(_, s)| s.to_string())
        })
        .expect("the secret line");
    assert_eq!(secret.len(), 64, "{stdout}");
    assert_eq!(stdout.matches(&secret).count(), 1, "{stdout}");
    assert!(
        stdout.contains("IFS= read -r MLX_SPEC_PIPELINE_SECRET && export MLX_SPEC_PIPELINE_SECRET"),
        "{stdout}"
    );
    assert!(stdout.contains(r"generate --prompt 'it'\''s'"), "{stdout}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"[{"ssh": "node-a", "ips": []}]"#).expect("write");
    let (out, _) = mlx_spec(
        &[
            "launch",
            "--hosts",
            bad.to_str().expect("utf-8"),
            "--",
            "distributed-check",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("host 0 (node-a) lists no ip"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn ranks_started_over_ssh_form_a_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = hosts_file(dir.path());
    // A stand-in for ssh that runs the remote command here.
    let ssh = dir.path().join("ssh");
    std::fs::write(&ssh, "#!/bin/sh\nshift\nexec sh -c \"$1\"\n").expect("write");
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
        .min(65000)
        .to_string();
    let ring = dir.path().join("ring.json");
    let (out, _) = mlx_spec(
        &[
            "launch",
            "--hosts",
            hosts.to_str().expect("utf-8"),
            "--ssh",
            "--ssh-program",
            ssh.to_str().expect("utf-8"),
            "--starting-port",
            &port,
            "--hostfile-path",
            ring.to_str().expect("utf-8"),
            "--join-timeout",
            "20",
            "--",
            "distributed-check",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("group of 2 rank(s) over ring"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn ranks_over_ssh_get_the_secret_and_a_private_hostfile_they_remove() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = hosts_file(dir.path());
    // The remote shells' `mktemp -d` makes its directories here (TMPDIR
    // passes through the stand-in for ssh).
    let ssh = dir.path().join("ssh");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    std::fs::write(&ssh, "#!/bin/sh\nshift\nexec sh -c \"$1\"\n").expect("write");
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
        .min(65000)
        .to_string();
    let (out, _) = mlx_spec(
        &[
            "launch",
            "--hosts",
            hosts.to_str().expect("utf-8"),
            "--ssh",
            "--ssh-program",
            ssh.to_str().expect("utf-8"),
            "--starting-port",
            &port,
            "--join-timeout",
            "20",
            "--",
            "distributed-check",
        ],
        &[("TMPDIR", tmp.to_str().expect("utf-8"))],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("group of 2 rank(s) over ring"),
        "{}",
        text(&out.stdout)
    );
    // Each rank removed its private hostfile directory once joined.
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("read tmp")
        .map(|e| e.map(|e| e.path()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
