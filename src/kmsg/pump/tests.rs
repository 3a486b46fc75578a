//! The reader over recorded streams: what `read` on `/dev/kmsg` returned,
//! in order (records, EPIPE, "nothing now"), into a real ring file.

use super::*;
use crate::kmsg::state::{resume_point, SeqFile};
use crate::rings::drops::DropReport;
use crate::rings::{KmesDir, LossReason, RingItem, RingReader, KERNEL_RING_CPU};
use std::collections::VecDeque;

/// What `read` returned, one call after another; when it runs out the
/// reader is told to stop.
struct Recorded(VecDeque<std::io::Result<Vec<u8>>>);

impl Recorded {
    fn new(reads: Vec<Read>) -> Recorded {
        Recorded(
            reads
                .into_iter()
                .map(|r| match r {
                    Read::Record(seq, text) => {
                        Ok(format!("6,{seq},{},-;{text}\n", seq * 10).into_bytes())
                    }
                    Read::Epipe => Err(std::io::Error::from_raw_os_error(libc::EPIPE)),
                    Read::Nothing => Err(std::io::Error::from(std::io::ErrorKind::WouldBlock)),
                })
                .collect(),
        )
    }
}

enum Read {
    Record(u64, &'static str),
    Epipe,
    Nothing,
}

impl Source for Recorded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.0.pop_front() {
            Some(Ok(bytes)) => {
                buf[..bytes.len()].copy_from_slice(&bytes);
                Ok(bytes.len())
            }
            Some(Err(e)) => Err(e),
            None => Err(std::io::Error::from(std::io::ErrorKind::WouldBlock)),
        }
    }

    fn wait(&mut self) -> bool {
        !self.0.is_empty()
    }

    fn stopping(&self) -> bool {
        false
    }
}

/// A kernel ring in `dir`.
fn ring(dir: &std::path::Path) -> Arc<CurrentRing> {
    let ring = KmesDir::new(dir)
        .attach_kernel(256 << 10, &mut Vec::new())
        .unwrap();
    assert_eq!(ring.cpu(), KERNEL_RING_CPU);
    Arc::new(CurrentRing::new(Arc::new(ring)))
}

/// What a drain of the ring would make of it: `Ok(kernel_seq)` per record,
/// `Err((count, reason))` per loss report.
fn drained(ring: &Arc<CurrentRing>) -> Vec<Result<u64, (u64, LossReason)>> {
    let mut reader = RingReader::new(ring.get());
    let mut out = Vec::new();
    while let Some(item) = reader.poll() {
        match item {
            RingItem::Event { event, .. } => match DropReport::parse(&event) {
                Some(r) => out.push(Err((r.count, r.reason))),
                None => out.push(Ok(crate::kmsg::fields_seq(event.fields).unwrap().1)),
            },
            RingItem::Gap(g) => panic!("the ring lost {g:?}"),
        }
    }
    out
}

fn pump(
    ring: &Arc<CurrentRing>,
    next: u64,
    reads: Vec<Read>,
) -> (Pump<Recorded>, Arc<KernelStats>) {
    let stats = Arc::new(KernelStats::default());
    let resume = Resume {
        next,
        last_ts_ns: None,
    };
    let p = Pump::new(Recorded::new(reads), ring.clone(), stats.clone(), resume);
    (p, stats)
}

#[test]
fn the_first_start_of_a_boot_reads_the_backlog_and_counts_what_the_kernel_no_longer_held() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path());
    let reads = vec![
        Read::Record(3, "c"),
        Read::Record(4, "d"),
        Read::Nothing,
        Read::Record(5, "e"),
    ];
    let (mut p, stats) = pump(&ring, 0, reads);
    p.run();
    assert_eq!(
        drained(&ring),
        vec![Err((3, LossReason::KernelOverwritten)), Ok(3), Ok(4), Ok(5)]
    );
    assert_eq!(p.next(), 6);
    assert_eq!(
        stats.backlog.load(Ordering::Relaxed),
        2,
        "read before it caught up"
    );
    assert_eq!(stats.lost.load(Ordering::Relaxed), 3);
}

#[test]
fn an_epipe_and_a_plain_jump_each_become_one_report_with_the_exact_count() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path());
    let reads = vec![
        Read::Record(5, "a"),
        Read::Record(6, "b"),
        Read::Epipe,
        Read::Record(10, "oldest left"),
        Read::Record(11, "c"),
        Read::Record(15, "after a jump without EPIPE"),
    ];
    let (mut p, stats) = pump(&ring, 5, reads);
    p.run();
    assert_eq!(
        drained(&ring),
        vec![
            Ok(5),
            Ok(6),
            Err((3, LossReason::KernelOverwritten)),
            Ok(10),
            Ok(11),
            Err((3, LossReason::KernelOverwritten)),
            Ok(15)
        ]
    );
    assert_eq!(stats.epipe.load(Ordering::Relaxed), 1);
    assert_eq!(stats.lost.load(Ordering::Relaxed), 6);
    assert_eq!(stats.loss_reports.load(Ordering::Relaxed), 2);
}

#[test]
fn a_restart_passes_over_what_the_ring_holds_even_when_the_file_is_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path());
    let (file, stored) = SeqFile::open(dir.path()).unwrap();
    assert_eq!(stored, None);
    let first = vec![
        Read::Record(0, "a"),
        Read::Record(1, "b"),
        Read::Record(2, "c"),
    ];
    let (p, _) = pump(&ring, 0, first);
    let mut p = p.with_state(file);
    p.run();
    // The file says 3. A crash after the next records reached the ring and
    // before the file was written leaves the file at 3 and the ring at 5:
    // emulated by a run without the file.
    let (mut p, _) = pump(&ring, 3, vec![Read::Record(3, "d"), Read::Record(4, "e")]);
    p.run();
    let (_, stored) = SeqFile::open(dir.path()).unwrap();
    let boot = crate::trusted::boot::id();
    assert_eq!(stored.as_ref().unwrap().next, 3);
    let resume = resume_point(stored.as_ref(), boot, &ring.get());
    assert_eq!(resume.next, 5, "one past the ring's newest record");
    assert!(resume.last_ts_ns.is_some());
    // The restarted reader reads the kernel's whole buffer again.
    let again = (0..7).map(|s| Read::Record(s, "x")).collect();
    let (mut p, stats) = pump(&ring, resume.next, again);
    p.run();
    assert_eq!(stats.skipped.load(Ordering::Relaxed), 5);
    let seqs: Vec<_> = drained(&ring).into_iter().map(Result::unwrap).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 4, 5, 6], "each record once");
    // The file ahead of the ring wins.
    let ahead = crate::kmsg::state::Stored {
        boot_id: boot.to_string(),
        next: 40,
    };
    assert_eq!(resume_point(Some(&ahead), boot, &ring.get()).next, 40);
}

#[test]
fn records_of_another_boot_in_the_ring_do_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path());
    let other = "0123456789abcdef0123456789abcdef";
    let (p, _) = pump(&ring, 0, vec![Read::Record(0, "a"), Read::Record(900, "z")]);
    let mut p = p.with_boot_id(other);
    p.run();
    let boot = crate::trusted::boot::id();
    assert_eq!(resume_point(None, boot, &ring.get()).next, 0);
    assert_eq!(resume_point(None, other, &ring.get()).next, 901);
    let stale = crate::kmsg::state::Stored {
        boot_id: other.to_string(),
        next: 901,
    };
    assert_eq!(resume_point(Some(&stale), boot, &ring.get()).next, 0);
}

#[test]
fn a_record_becomes_an_event_with_its_fields() {
    let record = record::parse(
        b"3,77,2000000,-,caller=T9;e1000e: link down\n SUBSYSTEM=pci\n DEVICE=+pci:0000:00:1f.6\n \
          TRANSPORT=forged\n",
    )
    .unwrap();
    let mut fields = Vec::new();
    let event = kernel_event(&record, 1_000, "b0", 16_000, &mut fields);
    assert_eq!((event.provider, event.name), ("kernel", "kern"));
    assert_eq!((event.pid, event.uid, event.level), (0, 0, Level::Err));
    assert_eq!(event.message, "e1000e: link down");
    let f: serde_json::Value = serde_json::from_str(event.fields).unwrap();
    assert_eq!(f["transport"], "kernel");
    assert_eq!(f["kernel_seq"], 77);
    assert_eq!(f["kernel_usec"], 2_000_000);
    assert_eq!(f["subsystem"], "pci");
    assert_eq!(f["device"], "+pci:0000:00:1f.6");
    assert_eq!(f["dict_transport"], "forged");
    assert_eq!(f["caller"], "T9");
    assert_eq!(f["boot_id"], "b0");
    // A message too long for the record is cut, and says so.
    let long = Record {
        message: "x".repeat(5000),
        ..record
    };
    let event = kernel_event(&long, 1_000, "b0", 2_000, &mut fields);
    assert!(event.payload_len() <= 2_000);
    let f: serde_json::Value = serde_json::from_str(event.fields).unwrap();
    assert_eq!(f["truncated_from"], 5000);
}
