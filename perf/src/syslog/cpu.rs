//! CPU time of a peer daemon: its process tree's, and its threads' by name.

/// CPU time (ns) of the process `pid` and of all its descendants.
pub(crate) fn tree_cpu_ns(pid: u32) -> u64 {
    let own = crate::system::stat_cpu_ns(&format!("/proc/{pid}/stat")).unwrap_or(0);
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|t| t.ok()).collect::<Vec<_>>())
        .unwrap_or_default();
    let children: Vec<u32> = tasks
        .iter()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    own + children.into_iter().map(tree_cpu_ns).sum::<u64>()
}

/// CPU time (ns) of the live threads of `pid` by name, digits and a
/// trailing '-' dropped (`writer-001` counts as `writer`).
pub(crate) fn threads_cpu_ns(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut by = std::collections::BTreeMap::new();
    for (name, ns) in crate::system::threads_cpu(&format!("/proc/{pid}")) {
        let stage = name
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .trim_end_matches('-')
            .to_string();
        *by.entry(stage).or_insert(0) += ns;
    }
    by
}

/// CPU figures of one measured run: the whole tree, and eventd's stages.
pub(super) struct CpuUse {
    pub(super) total_ns: Option<u64>,
    pub(super) stages: std::collections::BTreeMap<String, u64>,
}

pub(super) fn cpu_now(pid: Option<u32>) -> CpuUse {
    CpuUse {
        total_ns: pid.map(tree_cpu_ns),
        stages: pid.map(threads_cpu_ns).unwrap_or_default(),
    }
}
