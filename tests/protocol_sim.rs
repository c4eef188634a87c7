//! The sans-IO protocol cores (sender planner, receive tracker, block digests) driven through
//! an in-memory network that reorders and duplicates data frames and corrupts payloads, both
//! in ways the arrival check catches and in ways only the end-to-end seal catches. Control
//! messages keep their order (they share one TCP connection). No sockets, no files.

use std::collections::{HashMap, VecDeque};

use hsxfer::channels::control::{FilePlan, Message, PlanAction};
use hsxfer::channels::frame::BlockCheck;
use hsxfer::channels::manifest::{Entry, EntryKind};
use hsxfer::channels::receiver::{ReceiveTracker, Verdict};
use hsxfer::channels::sender::{Job, SendPlanner};
use hsxfer::channels::{blocks, Digest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEY: [u8; 32] = [3; 32];
const BS: u32 = 16;

struct Frame {
    file: u32,
    block: u64,
    payload: Vec<u8>,
    trailer: Digest,
}

#[derive(Default)]
struct Faults {
    caught_on_arrival: u64,
    caught_by_seal: u64,
}

fn run(seed: u64) -> Faults {
    let mut rng = StdRng::seed_from_u64(seed);
    let files: Vec<Vec<u8>> = (0..12)
        .map(|i| {
            let len = if i == 0 { 0 } else { rng.gen_range(1..200) };
            (0..len).map(|_| rng.gen()).collect()
        })
        .collect();
    let entries: Vec<Entry> = files
        .iter()
        .enumerate()
        .map(|(i, f)| Entry {
            id: i as u32,
            path: format!("f{i}"),
            mode: 0o644,
            mtime_ns: 0,
            kind: EntryKind::File {
                size: f.len() as u64,
            },
        })
        .collect();
    let mut planner = SendPlanner::new(BS);
    let mut tracker = ReceiveTracker::new(BS);
    let mut written: HashMap<u32, Vec<u8>> = HashMap::new();
    planner.announce(&entries, true);
    // Receiver side: file 1 resumes two blocks from a "journal", one of them stale.
    let mut plans = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let id = i as u32;
        written.insert(id, vec![0; f.len()]);
        let mut have = Vec::new();
        if id == 1 && f.len() > 2 * BS as usize {
            written.get_mut(&id).unwrap()[..BS as usize].copy_from_slice(&f[..BS as usize]);
            have.push((0, BlockCheck::of(&KEY, &f[..BS as usize])));
            have.push((1, Digest([0xEE; 32]))); // stale: must be re-sent
        }
        tracker.expect(id, f.len() as u64, &have).unwrap();
        plans.push(FilePlan {
            file: id,
            action: PlanAction::Send {
                have: have.iter().map(|h| h.0).collect(),
            },
        });
    }
    let mut to_receiver: VecDeque<Message> = VecDeque::new();
    let mut to_sender: VecDeque<Message> = VecDeque::new();
    let mut jobs: VecDeque<Job> = VecDeque::new();
    let mut wire: Vec<Frame> = Vec::new();
    let mut faults = Faults::default();
    for p in plans {
        let (j, seal) = planner.on_plan(&p).unwrap();
        jobs.extend(j);
        to_receiver.extend(seal);
    }
    let mut steps = 0;
    while !planner.finished() {
        steps += 1;
        assert!(steps < 200_000, "seed {seed}: no progress");
        match rng.gen_range(0..4) {
            // A data channel takes the next job: hash, maybe damage, put it on the wire.
            0 => {
                let Some(j) = jobs.pop_front() else { continue };
                let src = &files[j.file as usize][j.offset as usize..][..j.len as usize];
                let digest = BlockCheck::of(&KEY, src);
                if j.send {
                    let mut payload = src.to_vec();
                    let mut trailer = digest;
                    match rng.gen_range(0..10) {
                        0 => payload[0] ^= 1, // caught on arrival
                        1 => {
                            payload[0] ^= 2; // consistent damage: only the seal catches it
                            trailer = BlockCheck::of(&KEY, &payload);
                        }
                        _ => {}
                    }
                    if rng.gen_bool(0.1) {
                        wire.push(Frame {
                            file: j.file,
                            block: j.block,
                            payload: payload.clone(),
                            trailer,
                        });
                    }
                    wire.push(Frame {
                        file: j.file,
                        block: j.block,
                        payload,
                        trailer,
                    });
                }
                to_receiver.extend(planner.on_hashed(j.file, j.block, digest).unwrap());
            }
            // Frames arrive in any order.
            1 if !wire.is_empty() => {
                let f = wire.swap_remove(rng.gen_range(0..wire.len()));
                let got = BlockCheck::of(&KEY, &f.payload);
                let verdict = if !tracker.wants(f.file, f.block) {
                    Verdict::Pending
                } else if got != f.trailer {
                    faults.caught_on_arrival += 1;
                    to_sender.push_back(Message::Nack {
                        file: f.file,
                        block: f.block,
                    });
                    Verdict::Pending
                } else {
                    let size = files[f.file as usize].len() as u64;
                    let (off, _) = blocks::span(size, BS, f.block);
                    let w = written.get_mut(&f.file).unwrap();
                    w[off as usize..][..f.payload.len()].copy_from_slice(&f.payload);
                    tracker.on_block(f.file, f.block, got)
                };
                act(
                    f.file,
                    verdict,
                    &files,
                    &written,
                    &mut to_sender,
                    &mut faults,
                );
            }
            // Control to the receiver, in order.
            2 => {
                let Some(m) = to_receiver.pop_front() else {
                    continue;
                };
                let Message::Sealed {
                    file,
                    digests,
                    more,
                } = m
                else {
                    panic!("{m:?}")
                };
                let v = tracker.on_sealed(file, digests, more).unwrap();
                act(file, v, &files, &written, &mut to_sender, &mut faults);
            }
            // Control to the sender, in order.
            _ => match to_sender.pop_front() {
                Some(Message::Nack { file, block }) => {
                    jobs.push_back(planner.on_nack(file, block).unwrap())
                }
                Some(Message::FileDone { file }) => planner.on_done(file).unwrap(),
                Some(m) => panic!("{m:?}"),
                None => {}
            },
        }
    }
    faults
}

fn act(
    file: u32,
    v: Verdict,
    files: &[Vec<u8>],
    written: &HashMap<u32, Vec<u8>>,
    to_sender: &mut VecDeque<Message>,
    faults: &mut Faults,
) {
    match v {
        Verdict::Pending => {}
        Verdict::Complete { .. } => {
            assert_eq!(
                written[&file], files[file as usize],
                "file {file} committed with wrong bytes"
            );
            to_sender.push_back(Message::FileDone { file });
        }
        Verdict::Resend(blocks) => {
            for block in blocks {
                faults.caught_by_seal += 1;
                to_sender.push_back(Message::Nack { file, block });
            }
        }
    }
}

#[test]
fn every_file_arrives_intact_despite_reordering_duplication_and_corruption() {
    let mut total = Faults::default();
    for seed in 0..200 {
        let f = run(seed);
        total.caught_on_arrival += f.caught_on_arrival;
        total.caught_by_seal += f.caught_by_seal;
    }
    // Both detection paths were exercised (the seal path includes the stale journal block).
    assert!(total.caught_on_arrival > 100, "{}", total.caught_on_arrival);
    assert!(total.caught_by_seal > 300, "{}", total.caught_by_seal);
}
