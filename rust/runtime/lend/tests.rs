use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// A lending runtime of its own, its driver running (leaked: a driver never ends).
fn lending() -> &'static Lend {
    let runtime = Box::leak(Box::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    ));
    let lend = Box::leak(Box::new(Lend::new(runtime)));
    lend.spawn_driver().unwrap();
    lend
}

/// Waits for `done()` with a deadline, never sleeping blind.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn lending_is_on_unless_the_variable_says_0() {
    assert!(allowed_by(None).value);
    assert!(allowed_by(Some("1")).value);
    assert!(!allowed_by(Some("0")).value);
    let refused = allowed_by(Some("yes"));
    assert!(refused.value);
    assert!(refused.refused.unwrap().contains("0 or 1"));
}

#[test]
fn the_driver_runs_tasks_while_nobody_waits() {
    let lend = lending();
    let (sender, receiver) = std::sync::mpsc::channel();
    lend.runtime.spawn(async move {
        tokio::task::yield_now().await;
        sender
            .send(std::thread::current().name().map(str::to_owned))
            .unwrap();
    });
    let ran_on = receiver.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(ran_on.as_deref(), Some("jaxcluster-rt"));
}

#[test]
fn a_waiter_runs_the_task_it_waits_for_on_its_own_thread() {
    let lend = lending();
    let me = std::thread::current().id();
    let ran_here = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    // The task is spawned once the driver is out, so only the waiter can run it.
    let mut spawned = false;
    let seen = lend.drive_until(Instant::now() + Duration::from_secs(10), &mut || {
        if !spawned && lend.is_released() {
            spawned = true;
            let (ran_here, done) = (Arc::clone(&ran_here), Arc::clone(&done));
            lend.runtime.spawn(async move {
                ran_here.store(std::thread::current().id() == me, Ordering::SeqCst);
                done.store(true, Ordering::SeqCst);
            });
        }
        done.load(Ordering::SeqCst)
    });
    assert!(seen);
    assert!(
        ran_here.load(Ordering::SeqCst),
        "the task ran on another thread"
    );
    assert!(lend.releases() >= 1);
}

#[test]
fn a_waiter_that_gives_up_hands_the_runtime_back_at_once() {
    let lend = lending();
    let seen = lend.drive_until(Instant::now() + Duration::from_millis(5), &mut || false);
    assert!(!seen);
    // Nudged: the driver takes the core back without waiting for the grace; and it drives.
    eventually("the driver to take the core back", || !lend.is_released());
    let (sender, receiver) = std::sync::mpsc::channel();
    lend.runtime.spawn(async move { sender.send(()).unwrap() });
    receiver.recv_timeout(Duration::from_secs(10)).unwrap();
}

#[test]
fn after_a_seen_wait_the_driver_comes_back_after_the_grace() {
    let lend = lending();
    let seen = lend.drive_until(Instant::now() + Duration::from_secs(10), &mut || {
        lend.is_released()
    });
    assert!(seen);
    let returned = Instant::now();
    eventually("the driver to take the core back", || !lend.is_released());
    // It stayed out for the grace (measured from before the waiter's own return time).
    assert!(
        returned.elapsed() >= GRACE / 2,
        "came back after {:?}",
        returned.elapsed()
    );
}

#[test]
fn many_waiters_and_spawners_at_once_all_finish() {
    let lend = lending();
    let finished = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let finished = Arc::clone(&finished);
            std::thread::spawn(move || {
                let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (thread as u64 + 1);
                let mut random = move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                };
                for _ in 0..200 {
                    let flag = Arc::new(AtomicBool::new(false));
                    let set = Arc::clone(&flag);
                    let delay = random() % 3;
                    lend.runtime.spawn(async move {
                        for _ in 0..delay {
                            tokio::task::yield_now().await;
                        }
                        set.store(true, Ordering::SeqCst);
                    });
                    match random() % 4 {
                        // Spin driving, with a budget too short to see it now and then.
                        0 | 1 => {
                            let stop = Instant::now() + Duration::from_micros(random() % 300);
                            let _ = lend.drive_until(stop, &mut || flag.load(Ordering::SeqCst));
                        }
                        2 => lend.nudge(),
                        _ => std::thread::yield_now(),
                    }
                    eventually("the task", || flag.load(Ordering::SeqCst));
                }
                finished.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(finished.load(Ordering::SeqCst), 8);
    eventually("the driver to take the core back", || !lend.is_released());
}
