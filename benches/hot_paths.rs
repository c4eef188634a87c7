//! Micro-benchmarks of the per-byte and per-block hot paths: block digests (keyed BLAKE3,
//! whole and in cache-sized pieces), frame header encode/decode, the block scheduler (planner)
//! the receive tracker, the AEADs a TLS 1.3 record can be sealed with (which suite is
//! cheapest on this CPU decides the order hsxfer offers them in), and what running a quick
//! file job costs inline against a hop to a blocking thread.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hsxfer::channels::control::{FilePlan, PlanAction};
use hsxfer::channels::frame::{BlockCheck, BlockHeader, PIECE};
use hsxfer::channels::manifest::{Entry, EntryKind};
use hsxfer::channels::receiver::{ReceiveTracker, Verdict};
use hsxfer::channels::sender::SendPlanner;
use hsxfer::channels::Digest;

fn digests(c: &mut Criterion) {
    let block = vec![0x5au8; 4 << 20];
    let mut g = c.benchmark_group("block_digest");
    g.throughput(Throughput::Bytes(block.len() as u64));
    g.bench_function("keyed_blake3_4MiB_whole", |b| {
        b.iter(|| BlockCheck::of(&[7; 32], black_box(&block)))
    });
    g.bench_function("keyed_blake3_4MiB_in_pieces", |b| {
        b.iter(|| {
            let mut c = BlockCheck::new(&[7; 32]);
            for p in black_box(&block).chunks(PIECE) {
                c.update(p);
            }
            c.finish()
        })
    });
    g.bench_function("crc32c_4MiB_reference", |b| {
        b.iter(|| crc32c::crc32c(black_box(&block)))
    });
    g.finish();
}

fn framing(c: &mut Criterion) {
    let h = BlockHeader {
        file: 9,
        offset: 1 << 33,
        len: 4 << 20,
    };
    c.bench_function("frame_header_encode_decode", |b| {
        b.iter(|| BlockHeader::decode(&black_box(h).encode()).unwrap())
    });
}

fn scheduling(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduling");
    for files in [1u32, 10_000] {
        let size: u64 = if files == 1 { 64 << 30 } else { 64 << 10 };
        let entries: Vec<Entry> = (0..files)
            .map(|id| Entry {
                id,
                path: format!("f{id}"),
                mode: 0o644,
                mtime_ns: 0,
                kind: EntryKind::File { size },
            })
            .collect();
        g.bench_with_input(
            BenchmarkId::new("plan_hash_seal_done", files),
            &entries,
            |b, entries| {
                b.iter(|| {
                    let mut p = SendPlanner::new(4 << 20);
                    let mut t = ReceiveTracker::new(4 << 20);
                    p.announce(entries, true);
                    for e in entries {
                        let EntryKind::File { size } = e.kind else {
                            continue;
                        };
                        t.expect(e.id, size, &[]).unwrap();
                        let plan = FilePlan {
                            file: e.id,
                            action: PlanAction::Send { have: vec![] },
                        };
                        let (jobs, _) = p.on_plan(&plan).unwrap();
                        for j in jobs {
                            let d = Digest([j.block as u8; 32]);
                            t.on_block(j.file, j.block, d);
                            for m in p.on_hashed(j.file, j.block, d).unwrap() {
                                let hsxfer::channels::control::Message::Sealed {
                                    file,
                                    digests,
                                    more,
                                } = m
                                else {
                                    unreachable!("the planner only seals")
                                };
                                if let Verdict::Complete { .. } =
                                    t.on_sealed(file, digests, more).unwrap()
                                {
                                    p.on_done(file).unwrap();
                                }
                            }
                        }
                    }
                    assert!(p.finished());
                })
            },
        );
    }
    g.finish();
}

/// Sealing one full TLS record (16 KiB) with each TLS 1.3 AEAD, as rustls does with ring.
fn tls_records(c: &mut Criterion) {
    use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
    let mut g = c.benchmark_group("tls_record_seal");
    let mut record = vec![0x5au8; 16 << 10];
    g.throughput(Throughput::Bytes(record.len() as u64));
    for (name, alg) in [
        ("aes_128_gcm", &aead::AES_128_GCM),
        ("aes_256_gcm", &aead::AES_256_GCM),
        ("chacha20_poly1305", &aead::CHACHA20_POLY1305),
    ] {
        let key = LessSafeKey::new(UnboundKey::new(alg, &vec![7; alg.key_len()]).unwrap());
        g.bench_function(name, |b| {
            b.iter(|| {
                let nonce = Nonce::assume_unique_for_key([1; 12]);
                key.seal_in_place_separate_tag(nonce, Aad::empty(), black_box(&mut record))
                    .unwrap()
            })
        });
    }
    g.finish();
}

/// A quick file job (a `stat`, as cheap as a small write to the page cache) run through
/// `FileWork`, which runs it inline once it has seen it is quick, against the
/// `spawn_blocking` hop per job it replaced. The difference is what each small file saved
/// per read, write and commit.
fn file_work(c: &mut Criterion) {
    use hsxfer::session::fswork::FileWork;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("file_job");
    let work = FileWork::per_core();
    g.bench_function("file_work_inline", |b| {
        b.iter(|| {
            rt.block_on(async {
                work.run("stat", || std::fs::metadata("/").is_ok())
                    .await
                    .unwrap()
            })
        })
    });
    g.bench_function("spawn_blocking", |b| {
        b.iter(|| {
            rt.block_on(async {
                tokio::task::spawn_blocking(|| std::fs::metadata("/").is_ok())
                    .await
                    .unwrap()
            })
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    digests,
    framing,
    scheduling,
    tls_records,
    file_work
);
criterion_main!(benches);
