//! The export scenario's options, `--cluster-cpus` among them.

use anyhow::Context;
use eventd::rings::attach::parse_cpu_list;

/// `--cluster-cpus`: which CPUs the cluster runs on and which the rest.
pub(super) struct CpuSplit {
    pub(super) cluster: Vec<u32>,
    pub(super) client: Vec<u32>,
}

impl CpuSplit {
    /// Fails unless every process of `pids` (the cluster's) may run on the
    /// cluster's CPUs only, and this thread on the others only.
    pub(super) fn check(&self, pids: &[u32]) -> anyhow::Result<()> {
        for pid in pids {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let list = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .with_context(|| format!("no Cpus_allowed_list in /proc/{pid}/status"))?;
            let cpus = parse_cpu_list(list.trim())
                .with_context(|| format!("/proc/{pid}/status: Cpus_allowed_list {list:?}"))?;
            anyhow::ensure!(
                cpus == self.cluster,
                "--cluster-cpus: cluster process {pid} may run on {cpus:?}, not {:?}",
                self.cluster
            );
        }
        let own = crate::load::allowed_cpus();
        anyhow::ensure!(
            own == self.client,
            "--cluster-cpus: the harness may run on {own:?}, not {:?}",
            self.client
        );
        Ok(())
    }

    pub(super) fn describe(split: Option<&CpuSplit>) -> String {
        match split {
            None => "the cluster, eventd and the bare loop share every CPU".to_string(),
            Some(s) => format!(
                "the cluster on CPUs {:?}, eventd, the bare loop and the load on {:?}",
                s.cluster, s.client
            ),
        }
    }
}

/// The split `--cluster-cpus` asks for, checked against the CPUs this
/// process may use; None without the option.
pub(super) fn split_cpus(args: &Args) -> anyhow::Result<Option<CpuSplit>> {
    if args.cluster_cpus.is_empty() {
        return Ok(None);
    }
    let all = crate::load::allowed_cpus();
    for c in &args.cluster_cpus {
        anyhow::ensure!(
            all.contains(c),
            "--cluster-cpus: CPU {c} is not one this process may run on ({all:?})"
        );
    }
    let client: Vec<u32> = all
        .iter()
        .filter(|c| !args.cluster_cpus.contains(c))
        .copied()
        .collect();
    anyhow::ensure!(
        !client.is_empty(),
        "--cluster-cpus {:?} leaves no CPU for eventd and the bare loop",
        args.cluster_cpus
    );
    let mut cluster = args.cluster_cpus.clone();
    cluster.sort_unstable();
    cluster.dedup();
    Ok(Some(CpuSplit { cluster, client }))
}

/// The export scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(super) common: crate::cli::Common,
    #[command(flatten)]
    pub(super) system: crate::cli::System,
    /// Seconds of each ingest point, export off and on (default 10).
    #[arg(long)]
    pub(super) duration: Option<f64>,
    #[command(flatten)]
    pub(super) bytes: crate::cli::EventBytes,
    /// Events stored before they are exported.
    #[arg(long, default_value_t = 1_000_000)]
    pub(super) rows: u64,
    /// ExportBatchRows values measured (RowBinary).
    #[arg(long, value_delimiter = ',', default_value = "5000,50000,200000")]
    pub(super) batch_rows: Vec<u64>,
    /// Replicas of each of the cluster's two ClickHouse shards.
    #[arg(long, default_value_t = 2)]
    pub(super) replicas: usize,
    /// One ClickHouse server without ZooKeeper (the single-server schema)
    /// instead of 2 shards × --replicas.
    #[arg(long)]
    pub(super) single: bool,
    /// Seconds of the paced load (export lag).
    #[arg(long, default_value_t = 15.0)]
    pub(super) lag_secs: f64,
    /// ExportNice of every eventd started (default: eventd's own).
    #[arg(long, default_value_t = eventd::config::EXPORT_NICE_DEFAULT as i32)]
    pub(super) export_nice: i32,
    /// CPUs the ClickHouse servers and ZooKeeper run on (default: all,
    /// shared with eventd and the bare loop); eventd, the bare loop and
    /// the load then run on the other CPUs, as they would beside a cluster
    /// on machines of its own.
    #[arg(long, value_delimiter = ',')]
    pub(super) cluster_cpus: Vec<u32>,
}
