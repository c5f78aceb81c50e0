//! Unit tests of the job queue: order, one job at a time, drops, draining.

use super::*;
use crate::rpc::pb::{self, FunctionKind};
use crate::worker::store::StoredFunction;

fn run_request(closure_id: u64) -> JobRequest {
    JobRequest::Run {
        closure_id,
        function: StoredFunction {
            hash: [0; 32],
            kind: FunctionKind::Cloudpickle,
            payload: bytes::Bytes::new(),
        },
        args: None,
        worker_index: None,
        keep_result_id: None,
    }
}

fn queue() -> Arc<JobQueue> {
    Arc::new(JobQueue::new(Arc::default(), 0))
}

#[test]
fn jobs_come_out_in_order_one_at_a_time() {
    let q = queue();
    let _a = q.push(run_request(1)).unwrap();
    let _b = q.push(run_request(2)).unwrap();
    let Pop::Job(first) = q.pop(Duration::ZERO) else {
        panic!("expected a job")
    };
    assert!(matches!(
        first.request(),
        JobRequest::Run { closure_id: 1, .. }
    ));
    assert!(matches!(q.pop(Duration::ZERO), Pop::Busy));
    first.reply_status(Status::internal("done"));
    let Pop::Job(second) = q.pop(Duration::ZERO) else {
        panic!("expected a job")
    };
    assert!(matches!(
        second.request(),
        JobRequest::Run { closure_id: 2, .. }
    ));
    drop(second);
    assert!(matches!(q.pop(Duration::from_millis(1)), Pop::Empty));
}

#[test]
fn a_dropped_job_answers_internal_and_frees_the_executor() {
    let q = queue();
    let mut reply = q.push(run_request(1)).unwrap();
    let Pop::Job(job) = q.pop(Duration::ZERO) else {
        panic!("expected a job")
    };
    drop(job);
    let status = reply.try_recv().unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal);
    assert!(status.message().contains("without answering"));
    assert_eq!(q.depth(), (0, 0));
}

#[test]
fn a_closure_whose_caller_went_away_leaves_the_count_at_once_and_never_starts() {
    let q = queue();
    let _running = q.push(run_request(1)).unwrap();
    let Pop::Job(first) = q.pop(Duration::ZERO) else {
        panic!("expected a job")
    };
    let cancelled = q.push(run_request(2)).unwrap();
    let _waited = q.push(run_request(3)).unwrap();
    let release = q
        .push(JobRequest::ReleaseResource {
            resource_ids: vec![1],
        })
        .unwrap();
    assert_eq!(q.depth(), (3, 1));
    // The callers of closure 2 and of the release stop waiting (a deadline, a reset).
    drop(cancelled);
    drop(release);
    assert_eq!(
        q.depth(),
        (2, 1),
        "the release still runs; closure 2 never will"
    );
    first.reply_status(Status::internal("done"));
    let Pop::Job(next) = q.pop(Duration::ZERO) else {
        panic!("expected a job")
    };
    assert!(matches!(
        next.request(),
        JobRequest::Run { closure_id: 3, .. }
    ));
}

#[test]
fn draining_hands_back_queued_closures_but_keeps_releases() {
    let q = queue();
    let mut run = q.push(run_request(1)).unwrap();
    let mut release = q
        .push(JobRequest::ReleaseResource {
            resource_ids: vec![1],
        })
        .unwrap();
    assert!(q.begin_drain());
    assert!(!q.begin_drain());
    let refused = run.try_recv().unwrap().unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(q.push(run_request(2)).is_err());

    let Pop::Job(job) = q.pop(Duration::ZERO) else {
        panic!("the release should still be served")
    };
    assert!(!q.wait_idle(Duration::ZERO));
    job.reply(JobReply::ReleaseResource(pb::ReleaseResourceResponse {
        released: 1,
    }));
    assert!(release.try_recv().unwrap().is_ok());
    assert!(matches!(q.pop(Duration::ZERO), Pop::Drained));
    assert!(q.wait_idle(Duration::ZERO));
}

#[test]
fn a_draining_queue_still_takes_preemption_saves_for_an_executor_that_waits_for_them() {
    let q = queue();
    assert!(q.begin_drain());
    let session = SessionId::anonymous();
    assert!(
        q.push_as(&session, run_request(1)).is_err(),
        "ordinary closures are refused"
    );
    // Nothing queued: a plain pop says drained at once, a waiting one times out empty.
    assert!(matches!(q.pop(Duration::from_secs(5)), Pop::Drained));
    assert!(matches!(
        q.pop_while_draining(Duration::from_millis(1)),
        Pop::Empty
    ));
    let mut save = q.push_preemption_save(&session, run_request(2)).unwrap();
    let Pop::Job(job) = q.pop_while_draining(Duration::from_secs(5)) else {
        panic!("the preemption save should be served while draining")
    };
    assert!(matches!(
        job.request(),
        JobRequest::Run { closure_id: 2, .. }
    ));
    job.reply_status(Status::internal("read"));
    assert_eq!(save.try_recv().unwrap().unwrap_err().message(), "read");
    assert!(matches!(q.pop(Duration::ZERO), Pop::Drained));
}

/// Producers push at random moments around the spin budget (some caught spinning, some
/// after the executor parked, some while it takes the lock again) while the executor pops
/// with spinning on: every job comes out exactly once, none waits for a poll.
#[test]
fn a_spinning_executor_takes_every_job_pushed_at_any_moment_exactly_once() {
    use rand::Rng;
    const PRODUCERS: u64 = 8;
    const EACH: u64 = 150;
    let q = Arc::new(JobQueue::new(Arc::default(), 0).with_spin(Duration::from_micros(200)));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                let mut rng = rand::rng();
                let mut replies = Vec::new();
                for i in 0..EACH {
                    std::thread::sleep(Duration::from_micros(rng.random_range(0..400)));
                    replies.push(q.push(run_request(p * EACH + i + 1)).unwrap());
                }
                replies
            })
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < (PRODUCERS * EACH) as usize {
        assert!(
            Instant::now() < deadline,
            "only {} jobs came out",
            seen.len()
        );
        // A long timeout: a job pushed while the executor parks must wake it.
        match q.pop(Duration::from_secs(30)) {
            Pop::Job(job) => {
                let JobRequest::Run { closure_id, .. } = job.request() else {
                    panic!("not a run")
                };
                assert!(
                    seen.insert(*closure_id),
                    "closure {closure_id} came out twice"
                );
                job.reply_status(Status::internal("done"));
            }
            Pop::Empty => panic!("a queued job was not taken for 30 s"),
            Pop::Busy | Pop::Drained => panic!("the queue is neither busy nor draining"),
        }
    }
    for producer in producers {
        for mut reply in producer.join().unwrap() {
            assert!(reply.try_recv().is_ok(), "every job was answered");
        }
    }
}
