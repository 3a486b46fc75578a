//! The private ClickHouse cluster of the export scenario: its start, databases,
//! waits, counts and CPU.

use super::options::CpuSplit;
use crate::system::stat_cpu_ns;
use anyhow::Context;
use eventd::export::clickhouse::{ident, Client, Endpoint};
use eventd::export::state::Table;
use eventd_cluster::{self as cluster, Cluster, Options};
use std::time::{Duration, Instant};

/// The private cluster and a client of its first server (every insert and
/// statement goes there, as `ExportUrl` names one server).
pub(super) struct Ch {
    pub(super) cluster: Cluster,
    pub(super) client: Client,
    pub(super) url: String,
    pub(super) databases: usize,
    pub(super) version: String,
    /// Where the cluster runs, apart from everything else (`--cluster-cpus`).
    pub(super) split: Option<CpuSplit>,
}

impl Ch {
    /// 2 shards × `replicas` and ZooKeeper, or (`single`) one server
    /// without ZooKeeper.
    pub(super) fn start(replicas: usize, single: bool) -> anyhow::Result<Ch> {
        let opts = Options::default();
        let cluster = if single {
            Cluster::try_start_single(opts)
        } else {
            Cluster::try_start(2, replicas, opts)
        }
        .map_err(anyhow::Error::msg)?;
        let url = cluster.url(1, 1);
        let client = Client::new(
            Endpoint {
                url: url.clone(),
                user: None,
                password: None,
                tls: None,
            },
            eventd::export::ExportTunables::default().timeout,
        );
        let version = client.text("SELECT version()", &[])?.trim().to_string();
        Ok(Ch {
            cluster,
            client,
            url,
            databases: 0,
            version,
            split: None,
        })
    }

    /// A new database with eventd's schema (`eventctl export init`'s own
    /// code, on every server).
    pub(super) fn fresh_database(&mut self, what: &str) -> anyhow::Result<String> {
        self.databases += 1;
        let db = format!("perf_{}_{what}", self.databases);
        let schema = if self.cluster.is_single() {
            eventd::export::init::Schema::Single
        } else {
            eventd::export::init::Schema::Cluster
        };
        eventd::export::init::init(&self.client, &db, self.cluster.name(), Some(schema))
            .with_context(|| format!("creating database {db}"))?;
        Ok(db)
    }

    /// Waits (up to two minutes, then says so) until no server has a
    /// merge running or replication work queued, so that a run does not
    /// pay for the one before it.
    pub(super) fn wait_quiet(&self) {
        let sql = "SELECT (SELECT count() FROM system.merges) + \
                   (SELECT count() FROM system.replication_queue)";
        let quiet = cluster::wait_until(Duration::from_secs(120), || {
            self.cluster.urls().iter().all(|u| {
                self.cluster
                    .query_with(u, sql, &[])
                    .is_ok_and(|t| t.trim() == "0")
            })
        });
        if !quiet {
            eprintln!(
                "warning: ClickHouse still merging or replicating after 120 s; measuring anyway"
            );
        }
    }

    /// Drops `db` on every server, so that its merges and fetches do not
    /// run beside the next measurement.
    pub(super) fn drop_database(&self, db: &str) -> anyhow::Result<()> {
        let on_cluster = if self.cluster.is_single() {
            String::new()
        } else {
            format!(" ON CLUSTER {}", ident(self.cluster.name()))
        };
        self.client.run(
            &format!("DROP DATABASE IF EXISTS {}{on_cluster}", ident(db)),
            &[("distributed_ddl_task_timeout", "180")],
        )?;
        Ok(())
    }

    /// Rows of `db.table` on the replica the Distributed table reads.
    pub(super) fn count(&self, db: &str, table: Table) -> anyhow::Result<u64> {
        let text = self.client.text(
            &format!("SELECT count() FROM {}.{}", ident(db), table.name()),
            &[],
        )?;
        text.trim()
            .parse()
            .with_context(|| format!("count() answered {text:?}"))
    }

    /// Waits until `db.table` holds `expected` rows on every replica (the
    /// replicas fetch what the insert wrote to one of them); the count
    /// last seen.
    pub(super) fn wait_count(&self, db: &str, table: Table, expected: u64) -> anyhow::Result<u64> {
        let local = if self.cluster.is_single() {
            ""
        } else {
            "_local"
        };
        let sql = format!("SELECT count() FROM {}.{}{local}", ident(db), table.name());
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            // Each shard's replicas together; the first replica of each
            // shard holds its part of the total once replication is done.
            let mut total = 0;
            let mut agree = true;
            for s in 1..=self.cluster.shards() {
                let counts: Vec<u64> = (1..=self.cluster.replicas())
                    .map(|r| {
                        self.cluster
                            .query_with(&self.cluster.url(s, r), &sql, &[])
                            .ok()
                            .and_then(|t| t.trim().parse().ok())
                            .unwrap_or(0)
                    })
                    .collect();
                agree &= counts.windows(2).all(|w| w[0] == w[1]);
                total += counts.first().copied().unwrap_or(0);
            }
            if (agree && total == expected) || Instant::now() >= deadline {
                return Ok(total);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What runs: one server, or the cluster.
    pub(super) fn layout(&self) -> String {
        if self.cluster.is_single() {
            "1 server (single-server schema, no ZooKeeper)".to_string()
        } else {
            format!(
                "{} shards × {} replicas + ZooKeeper",
                self.cluster.shards(),
                self.cluster.replicas()
            )
        }
    }

    /// Every server's and ZooKeeper's process id.
    pub(super) fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = Vec::new();
        for s in 1..=self.cluster.shards() {
            for r in 1..=self.cluster.replicas() {
                pids.extend(self.cluster.pid(s, r));
            }
        }
        pids.extend(self.cluster.zookeeper_pid());
        pids
    }

    /// CPU time (ns) of every server and ZooKeeper so far.
    pub(super) fn cpu_ns(&self) -> u64 {
        self.pids()
            .iter()
            .filter_map(|p| stat_cpu_ns(&format!("/proc/{p}/stat")))
            .sum()
    }
}

/// Sets the niceness of every thread of every ClickHouse server and of
/// ZooKeeper (niceness is per thread on Linux; threads they start later
/// inherit it from the thread that starts them).
pub(super) fn renice_cluster(ch: &Ch, nice: i32) {
    for pid in ch.pids() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for tid in tasks.flatten() {
            let Some(tid) = tid.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
                continue;
            };
            // SAFETY: setpriority only reads its arguments; a thread that
            // ended meanwhile gives ESRCH, which is ignored.
            unsafe { libc::setpriority(libc::PRIO_PROCESS as _, tid as libc::id_t, nice) };
        }
    }
}
