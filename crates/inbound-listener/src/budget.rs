//! One open-file budget for several listeners.
//!
//! Every accepted connection is a descriptor, and so is every Redis connection, the
//! configuration file a reload reads and the log. When a listener may accept until `accept`
//! fails for want of descriptors, one hostile client on one port takes them all: the other
//! listener cannot accept and a Redis reconnect fails (seen: 300 idle connections to the gRPC
//! port under a 256-descriptor limit stopped the HTTP port and Redis). So the caps of the
//! listeners are fitted under the limit, after descriptors reserved for the rest of the
//! process: a listener at its cap queues new clients in the backlog, and the reserve stays
//! free.

/// The open-file limit and what is reserved outside the listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The soft open-file limit (`RLIMIT_NOFILE`).
    pub limit: u64,
    /// Descriptors kept for everything but the listeners' connections.
    pub reserved: u64,
}

impl Budget {
    /// Descriptors the listeners may hold together.
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.reserved)
    }

    /// The caps that fit: `caps` (each listener's configured `max_connections`) as they are
    /// when their sum fits in [`Self::available`]; otherwise shared out max-min fairly (each
    /// listener gets an equal share, and what a listener with a smaller cap leaves goes to the
    /// others), so neither listener can take the other's share. At least 1 each.
    pub fn fit(&self, caps: &[usize]) -> Vec<usize> {
        let available = usize::try_from(self.available()).unwrap_or(usize::MAX);
        let mut out = vec![0usize; caps.len()];
        let mut left = available;
        let mut open: Vec<usize> = (0..caps.len()).filter(|&i| caps[i] > 0).collect();
        // Water-filling: hand out equal shares; a listener whose cap is below its share takes
        // its cap and leaves the rest to the next round.
        while !open.is_empty() && left > 0 {
            let share = left / open.len();
            if share == 0 {
                // Fewer descriptors than listeners still wanting: one each, in order.
                for &i in open.iter().take(left) {
                    out[i] += 1;
                }
                break;
            }
            let mut next = Vec::with_capacity(open.len());
            for &i in &open {
                let give = (caps[i] - out[i]).min(share);
                out[i] += give;
                left -= give;
                if out[i] < caps[i] {
                    next.push(i);
                }
            }
            open = next;
        }
        out.iter().map(|&n| n.max(1)).collect()
    }
}

/// The soft open-file limit of this process; `None` when unlimited or unknown.
pub fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Descriptors open in this process now (Linux: the entries of `/proc/self/fd`, less the one
/// that lists them); `None` where that cannot be read.
pub fn open_descriptors() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    let n = entries.count() as u64;
    Some(n.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: u64, reserved: u64) -> Budget {
        Budget { limit, reserved }
    }

    #[test]
    fn caps_that_fit_are_kept() {
        assert_eq!(
            budget(65_536, 100).fit(&[10_000, 10_000]),
            vec![10_000, 10_000]
        );
        assert_eq!(budget(300, 100).fit(&[150, 50]), vec![150, 50]);
    }

    #[test]
    fn caps_that_do_not_fit_are_shared_equally() {
        assert_eq!(budget(256, 56).fit(&[10_000, 10_000]), vec![100, 100]);
        assert_eq!(
            budget(257, 56).fit(&[10_000, 10_000]).iter().sum::<usize>(),
            201
        );
    }

    #[test]
    fn what_a_small_cap_leaves_goes_to_the_other() {
        assert_eq!(budget(256, 56).fit(&[10, 10_000]), vec![10, 190]);
        assert_eq!(budget(256, 56).fit(&[10_000, 30]), vec![170, 30]);
    }

    #[test]
    fn the_sum_never_exceeds_what_is_available_and_each_gets_one() {
        for limit in [0u64, 1, 2, 3, 10, 64, 255, 1000] {
            for caps in [
                [1usize, 1],
                [5, 1000],
                [1000, 5],
                [7, 7],
                [1_000_000, 1_000_000],
            ] {
                let b = budget(limit, 3);
                let fit = b.fit(&caps);
                let sum: usize = fit.iter().sum();
                assert!(fit.iter().all(|&n| n >= 1), "{limit} {caps:?} {fit:?}");
                assert!(fit.iter().zip(caps).all(|(&f, c)| f <= c.max(1)));
                let available = b.available() as usize;
                if available >= caps.len() {
                    assert!(sum <= available, "{limit} {caps:?} {fit:?}");
                    // Nothing is left unused while a listener wants more.
                    let wanted: usize = caps.iter().sum();
                    assert_eq!(sum, wanted.min(available), "{limit} {caps:?} {fit:?}");
                }
            }
        }
    }

    #[test]
    fn the_limit_and_open_descriptors_are_read() {
        let limit = open_file_limit();
        let open = open_descriptors();
        if cfg!(target_os = "linux") {
            assert!(limit.is_some_and(|l| l > 0));
            assert!(
                open.is_some_and(|n| n >= 3),
                "stdin, stdout, stderr: {open:?}"
            );
        }
    }
}
