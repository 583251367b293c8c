//! Names of the system calls a thread is commonly found blocked in, for the state of a
//! wall-clock sample (`blocked:read`). The numbers are the architecture's own, so the table is
//! per architecture; a number missing here is written as `syscall-N`.

/// The name of system call `nr` on this architecture, if it is one threads block in.
pub fn name(nr: u16) -> Option<&'static str> {
    TABLE.iter().find(|(n, _)| *n == nr).map(|(_, name)| *name)
}

#[cfg(target_arch = "x86_64")]
const TABLE: &[(u16, &str)] = &[
    (0, "read"),
    (1, "write"),
    (7, "poll"),
    (17, "pread64"),
    (18, "pwrite64"),
    (19, "readv"),
    (20, "writev"),
    (23, "select"),
    (24, "sched_yield"),
    (34, "pause"),
    (35, "nanosleep"),
    (42, "connect"),
    (43, "accept"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (47, "recvmsg"),
    (61, "wait4"),
    (64, "semget"),
    (65, "semop"),
    (70, "msgrcv"),
    (73, "flock"),
    (74, "fsync"),
    (75, "fdatasync"),
    (128, "rt_sigtimedwait"),
    (130, "rt_sigsuspend"),
    (202, "futex"),
    (208, "io_getevents"),
    (220, "semtimedop"),
    (230, "clock_nanosleep"),
    (232, "epoll_wait"),
    (247, "waitid"),
    (257, "openat"),
    (270, "pselect6"),
    (271, "ppoll"),
    (281, "epoll_pwait"),
    (288, "accept4"),
    (299, "recvmmsg"),
    (307, "sendmmsg"),
    (318, "getrandom"),
    (426, "io_uring_enter"),
    (441, "epoll_pwait2"),
];

#[cfg(target_arch = "aarch64")]
const TABLE: &[(u16, &str)] = &[
    (22, "epoll_pwait"),
    (32, "flock"),
    (56, "openat"),
    (63, "read"),
    (64, "write"),
    (65, "readv"),
    (66, "writev"),
    (67, "pread64"),
    (68, "pwrite64"),
    (72, "pselect6"),
    (73, "ppoll"),
    (82, "fsync"),
    (83, "fdatasync"),
    (95, "waitid"),
    (98, "futex"),
    (101, "nanosleep"),
    (115, "clock_nanosleep"),
    (124, "sched_yield"),
    (133, "rt_sigsuspend"),
    (137, "rt_sigtimedwait"),
    (188, "msgrcv"),
    (192, "semtimedop"),
    (193, "semop"),
    (202, "accept"),
    (203, "connect"),
    (206, "sendto"),
    (207, "recvfrom"),
    (211, "sendmsg"),
    (212, "recvmsg"),
    (242, "accept4"),
    (243, "recvmmsg"),
    (260, "wait4"),
    (269, "sendmmsg"),
    (278, "getrandom"),
    (426, "io_uring_enter"),
    (441, "epoll_pwait2"),
];

#[cfg(test)]
mod tests {
    #[test]
    fn the_calls_threads_wait_in_are_named_by_this_architectures_numbers() {
        assert_eq!(super::name(libc::SYS_read as u16), Some("read"));
        assert_eq!(super::name(libc::SYS_futex as u16), Some("futex"));
        assert_eq!(super::name(libc::SYS_ppoll as u16), Some("ppoll"));
        assert_eq!(super::name(libc::SYS_accept4 as u16), Some("accept4"));
        assert_eq!(super::name(libc::SYS_clock_nanosleep as u16), Some("clock_nanosleep"));
        assert_eq!(super::name(libc::SYS_epoll_pwait as u16), Some("epoll_pwait"));
        assert_eq!(super::name(9999), None);
    }
}
