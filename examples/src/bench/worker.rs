//! Worker processes: the bench re-executes itself with `--worker`, so each drain runs the
//! runtime in processes of its own (its memory is only the runtime's, and several
//! processes can share one database as a deployment would).
//!
//! Protocol on stdin/stdout, one line each: the child prints `ready` once its pool is
//! connected, starts its runtime on `go`, shuts down on `stop` (or end of input) and
//! prints `rss_kib <VmHWM> cpu_ms <CPU time since go>` before it exits.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use jobq::Runtime;
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::util::{Noop, cpu_time, peak_rss_kib};

/// Connections each worker process's pool holds: the runtime needs one each for claims,
/// completions, heartbeats and the reaper, and LISTEN takes its own.
const WORKER_POOL: u32 = 6;

/// The child side: `bench --worker <database url> <concurrency>`.
pub(crate) async fn child_main(url: &str, concurrency: usize) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(WORKER_POOL)
        .min_connections(3)
        .connect(url)
        .await?;
    let runtime = Runtime::builder(pool)
        .auto_register(false)
        .register::<Noop>()
        .queue("default", concurrency)
        .build()?;
    let mut out = tokio::io::stdout();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    out.write_all(b"ready\n").await?;
    out.flush().await?;
    match lines.next_line().await?.as_deref() {
        Some("go") => {}
        _ => return Ok(()),
    }
    let cpu_at_go = cpu_time();
    let handle = runtime.start().await?;
    // Wait for `stop` or the parent going away.
    while let Some(line) = lines.next_line().await? {
        if line == "stop" {
            break;
        }
    }
    handle.shutdown().await;
    let cpu = cpu_time().saturating_sub(cpu_at_go);
    let report = format!("rss_kib {} cpu_ms {}\n", peak_rss_kib(), cpu.as_millis());
    out.write_all(report.as_bytes()).await?;
    out.flush().await?;
    Ok(())
}

/// The parent's handle on one worker process.
#[derive(Debug)]
pub(crate) struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Worker {
    /// Starts a worker process and waits until it is connected and ready.
    pub(crate) async fn spawn(url: &str, concurrency: usize) -> anyhow::Result<Worker> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("--worker")
            .arg(url)
            .arg(concurrency.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker process")?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let mut w = Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
        };
        let line = tokio::time::timeout(Duration::from_secs(30), w.stdout.next_line())
            .await
            .context("worker did not become ready")??;
        if line.as_deref() != Some("ready") {
            bail!("worker process failed to start: {line:?}");
        }
        Ok(w)
    }

    pub(crate) async fn go(&mut self) -> anyhow::Result<()> {
        self.stdin.write_all(b"go\n").await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Shuts the worker down and returns what it used.
    pub(crate) async fn stop(mut self) -> anyhow::Result<Used> {
        self.stdin.write_all(b"stop\n").await?;
        self.stdin.flush().await?;
        let line = tokio::time::timeout(Duration::from_secs(60), self.stdout.next_line())
            .await
            .context("worker did not stop")??;
        let status = self.child.wait().await?;
        if !status.success() {
            bail!("worker process exited with {status}");
        }
        let used = line.as_deref().and_then(|l| {
            let mut words = l.split_whitespace();
            let (Some("rss_kib"), Some(rss), Some("cpu_ms"), Some(cpu)) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return None;
            };
            Some(Used {
                rss_kib: rss.parse().ok()?,
                cpu: Duration::from_millis(cpu.parse().ok()?),
            })
        });
        used.with_context(|| format!("unexpected worker report {line:?}"))
    }
}

/// What a worker process used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Used {
    /// Peak resident set size, KiB.
    pub(crate) rss_kib: u64,
    /// CPU time from `go` to its report, all threads (10 ms ticks).
    pub(crate) cpu: Duration,
}
