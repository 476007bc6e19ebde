//! A throwaway PostgreSQL cluster for machines where PostgreSQL is installed but not
//! running: `initdb` into a temporary directory, `pg_ctl start` on a free port, once per
//! process.
//!
//! Rust runs no destructor for statics at exit, so the cluster is stopped by a watchdog: a
//! small `sh` loop started alongside it that waits for this process to end, then runs
//! `pg_ctl stop -m immediate` and removes the directory. The cluster therefore outlives the
//! test process by about a second.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tokio::sync::OnceCell;

/// Why no throwaway cluster is available.
#[derive(Debug, Clone)]
pub(crate) enum ClusterError {
    /// `initdb` and `pg_ctl` were not found.
    NoBinaries,
    /// They were found but the cluster did not start.
    Failed(String),
}

static CLUSTER: OnceCell<Result<String, ClusterError>> = OnceCell::const_new();

/// The admin URL of this process's throwaway cluster, starting it on first use.
pub(crate) async fn throwaway() -> Result<String, ClusterError> {
    CLUSTER
        .get_or_init(|| async {
            tokio::task::spawn_blocking(start)
                .await
                .unwrap_or_else(|e| Err(ClusterError::Failed(format!("start-up task failed: {e}"))))
                .map(|c| c.url())
        })
        .await
        .clone()
}

/// Where `initdb` and `pg_ctl` live: `PATH` first, then the usual install locations,
/// newest version first.
fn find_bin_dir() -> Option<PathBuf> {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Some(path) = std::env::var_os("PATH")
        && let Some(d) = std::env::split_paths(&path).find(|d| has_both(d))
    {
        return Some(d);
    }
    let mut candidates = Vec::new();
    for (parent, prefix, suffix) in [
        ("/usr/lib/postgresql", "", "bin"),
        ("/usr", "pgsql-", "bin"),
        ("/opt/homebrew/opt", "postgresql", "bin"),
        ("/usr/local/opt", "postgresql", "bin"),
    ] {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix(prefix) {
                let version: u32 = rest
                    .trim_start_matches('@')
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                candidates.push((version, entry.path().join(suffix)));
            }
        }
    }
    candidates.push((0, PathBuf::from("/usr/local/pgsql/bin")));
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    candidates.into_iter().map(|(_, d)| d).find(|d| has_both(d))
}

/// Whether this process runs as root (initdb refuses to).
fn is_root() -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(meta) = std::fs::metadata("/proc/self") {
            return meta.uid() == 0;
        }
    }
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// How to run a PostgreSQL binary: directly, or as the `postgres` user when we are root.
#[derive(Debug, Clone, Copy)]
enum RunAs {
    Me,
    /// `runuser -u postgres --` (util-linux).
    Runuser,
    /// `su postgres -s /bin/sh -c '…'`.
    Su,
}

impl RunAs {
    fn pick() -> Result<RunAs, ClusterError> {
        if !is_root() {
            return Ok(RunAs::Me);
        }
        let has_user = Command::new("id")
            .args(["-u", "postgres"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_user {
            return Err(ClusterError::Failed(
                "running as root, and initdb refuses root, but there is no `postgres` user to run it as".into(),
            ));
        }
        let runuser = Command::new("runuser")
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        Ok(if runuser { RunAs::Runuser } else { RunAs::Su })
    }

    fn command(self, program: &Path, args: &[String]) -> Command {
        match self {
            RunAs::Me => {
                let mut c = Command::new(program);
                c.args(args);
                c
            }
            RunAs::Runuser => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(program).args(args);
                c
            }
            RunAs::Su => {
                let mut c = Command::new("su");
                c.args(["postgres", "-s", "/bin/sh", "-c"])
                    .arg(shell_line(program, args));
                c
            }
        }
    }

    /// The same command as one `sh` line (for the watchdog).
    fn shell(self, program: &Path, args: &[String]) -> String {
        let line = shell_line(program, args);
        match self {
            RunAs::Me => line,
            RunAs::Runuser => format!("runuser -u postgres -- {line}"),
            RunAs::Su => format!("su postgres -s /bin/sh -c {}", quote(&line)),
        }
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn shell_line(program: &Path, args: &[String]) -> String {
    let mut line = quote(&program.to_string_lossy());
    for a in args {
        line.push(' ');
        line.push_str(&quote(a));
    }
    line
}

/// Runs `cmd` to completion; its output becomes the error when it fails.
fn run(mut cmd: Command, what: &str) -> Result<(), ClusterError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ClusterError::Failed(format!("could not run {what}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .to_owned();
    Err(ClusterError::Failed(format!(
        "{what} failed ({}): {last}",
        out.status
    )))
}

fn free_port() -> Result<u16, ClusterError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| ClusterError::Failed(format!("no free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| ClusterError::Failed(format!("no free port: {e}")))
}

/// A private PostgreSQL cluster in a temporary directory, on a free port of 127.0.0.1,
/// with trust authentication for the `postgres` role — for tests that must stop and
/// restart "the database" without disturbing anything else (and for the fallback when no
/// server is running). Durability settings are relaxed (`fsync=off`), so use
/// [`stop`](Self::stop) (a clean shutdown), not a crash, between restarts.
///
/// The cluster is stopped and its directory removed by a watchdog shortly after the
/// process that started it exits.
///
/// ```no_run
/// # async fn t() -> Result<(), jobq_testing::Error> {
/// let cluster = jobq_testing::TempCluster::start().await?;
/// let db = jobq_testing::TestDatabase::on_server(&cluster.url(), 10).await?;
/// cluster.stop().await?;   // the database goes away ...
/// cluster.restart().await?; // ... and comes back on the same port
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TempCluster {
    run_as: RunAs,
    pg_ctl: PathBuf,
    dir: String,
    port: u16,
}

impl TempCluster {
    /// `initdb` and `pg_ctl start` (as the `postgres` user when running as root).
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`](crate::Error::Unreachable) when PostgreSQL's binaries are
    /// missing or the cluster does not start, saying why in one line.
    pub async fn start() -> Result<TempCluster, crate::Error> {
        tokio::task::spawn_blocking(start)
            .await
            .unwrap_or_else(|e| Err(ClusterError::Failed(format!("start-up task failed: {e}"))))
            .map_err(|e| crate::Error::Unreachable {
                url: "a throwaway cluster".into(),
                cause: match e {
                    ClusterError::NoBinaries => {
                        "PostgreSQL's binaries (initdb, pg_ctl) were not found".into()
                    }
                    ClusterError::Failed(why) => why,
                },
                hint: "install PostgreSQL's server package".into(),
            })
    }

    /// The admin URL (`postgres` role, `postgres` database).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Shuts the server down (`pg_ctl stop -m fast`: open connections are cut).
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`](crate::Error::Unreachable) when `pg_ctl` fails.
    pub async fn stop(&self) -> Result<(), crate::Error> {
        let args: Vec<String> = ["-D", &self.dir, "-m", "fast", "-w", "stop"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        self.pg_ctl_run(args, "pg_ctl stop").await
    }

    /// Starts the server again on the same port and data directory.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`](crate::Error::Unreachable) when `pg_ctl` fails.
    pub async fn restart(&self) -> Result<(), crate::Error> {
        self.pg_ctl_run(start_args(&self.dir, self.port), "pg_ctl start")
            .await
    }

    async fn pg_ctl_run(&self, args: Vec<String>, what: &'static str) -> Result<(), crate::Error> {
        let (run_as, pg_ctl, url) = (self.run_as, self.pg_ctl.clone(), self.url());
        tokio::task::spawn_blocking(move || run(run_as.command(&pg_ctl, &args), what))
            .await
            .unwrap_or_else(|e| Err(ClusterError::Failed(format!("{what} task failed: {e}"))))
            .map_err(|e| crate::Error::Unreachable {
                url,
                cause: match e {
                    ClusterError::NoBinaries => "no binaries".into(),
                    ClusterError::Failed(why) => why,
                },
                hint: "see the cluster's server.log in its directory".into(),
            })
    }
}

fn start_args(dir: &str, port: u16) -> Vec<String> {
    let log = format!("{dir}/server.log");
    let options = format!(
        "-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c fsync=off \
         -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    );
    [
        "-D", dir, "-l", &log, "-o", &options, "-w", "-t", "30", "start",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn start() -> Result<TempCluster, ClusterError> {
    let bin = find_bin_dir().ok_or(ClusterError::NoBinaries)?;
    let run_as = RunAs::pick()?;
    let (initdb, pg_ctl) = (bin.join("initdb"), bin.join("pg_ctl"));
    let dir = std::env::temp_dir().join(format!(
        "jobq-testing-pg-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let dir_s = dir.to_string_lossy().into_owned();
    // initdb creates the directory itself, owned by whoever runs it.
    let init_args: Vec<String> = [
        "-D",
        &dir_s,
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    run(run_as.command(&initdb, &init_args), "initdb")?;
    let stop_args: Vec<String> = ["-D", &dir_s, "-m", "immediate", "stop"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    spawn_watchdog(run_as, &pg_ctl, &stop_args, &dir);

    let mut last_err = ClusterError::Failed("pg_ctl start was not attempted".into());
    for _ in 0..3 {
        let port = free_port()?;
        match run(
            run_as.command(&pg_ctl, &start_args(&dir_s, port)),
            "pg_ctl start",
        ) {
            Ok(()) => {
                tracing::info!(dir = %dir_s, port, "started a throwaway PostgreSQL cluster");
                return Ok(TempCluster {
                    run_as,
                    pg_ctl,
                    dir: dir_s,
                    port,
                });
            }
            Err(e) => last_err = e,
        }
    }
    Err(last_err)
}

/// Starts the `sh` loop that stops the cluster and removes its directory once this
/// process is gone. It ignores the terminal's interrupt so it can clean up after Ctrl-C.
fn spawn_watchdog(run_as: RunAs, pg_ctl: &Path, stop_args: &[String], dir: &Path) {
    let script = format!(
        "trap '' INT HUP TERM; while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
        pid = std::process::id(),
        stop = run_as.shell(pg_ctl, stop_args),
        dir = quote(&dir.to_string_lossy()),
    );
    let spawned = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    if let Err(e) = spawned {
        tracing::warn!(error = %e, dir = %dir.display(), "could not start the throwaway cluster's watchdog; stop it by hand");
    }
}
