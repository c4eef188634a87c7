"""The Python package against a real server on loopback (hsxfer.Server, in this process)."""

import _thread
import hashlib
import multiprocessing
import os
import pathlib
import secrets
import signal
import sys
import threading
import time

import pytest

import hsxfer


def write_token(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path


def random_file(path, size):
    with open(path, "wb") as f:
        f.write(os.urandom(size))


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tree_digests(top):
    out = {}
    for d, _, files in os.walk(top):
        for name in files:
            p = os.path.join(d, name)
            out[os.path.relpath(p, top)] = digest(p)
    return out


@pytest.fixture(autouse=True)
def own_profiles(tmp_path, monkeypatch):
    """Path profiles, server keys and known servers go to directories of the test's own, not
    the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "cache" / "hsxfer" / "profiles"


@pytest.fixture
def served(tmp_path):
    """A server with a token, its root, and the token file (outside the root)."""
    root = tmp_path / "root"
    root.mkdir()
    token = write_token(tmp_path / "token")
    with hsxfer.Server(root, token_file=token) as server:
        yield server, root, token


def remote(server, path):
    return f"127.0.0.1:{path}"


def test_push_and_pull_a_tree_with_progress(served, tmp_path):
    server, root, token = served
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    for i in range(20):
        random_file(data / f"f{i}", 1000 * i + 1)
    random_file(data / "sub" / "big", 9 << 20)
    (root / "incoming").mkdir()
    seen = []
    report = hsxfer.push(
        [str(data)],
        remote(server, "incoming/"),
        recursive=True,
        channels=4,
        port=server.port,
        token_file=token,
        progress=seen.append,
        interval=0.05,
    )
    # The summary event of docs/json.md, as the command prints it.
    assert (report["type"], report["schema"]) == ("summary", 2)
    assert report["operation"] == "push"
    assert report["verified"] is True
    assert report["files"] == 21
    assert tree_digests(root / "incoming" / "data") == tree_digests(data)
    # The callback saw the transfer: counters only grow, and the last call is the end.
    assert seen, "the progress callback was never called"
    assert [p["bytes"] for p in seen] == sorted(p["bytes"] for p in seen)
    assert seen[-1]["bytes"] == seen[-1]["expected"] == report["bytes"]
    assert seen[-1]["files_done"] == 21
    assert sum(seen[-1]["channels"]) == report["bytes"]

    back = tmp_path / "back"
    back.mkdir()
    report = hsxfer.pull(
        remote(server, "incoming/data"),
        back,
        recursive=True,
        port=server.port,
        token_file=token,
    )
    assert report["operation"] == "pull" and report["verified"] is True
    assert tree_digests(back / "data") == tree_digests(data)


def test_copy_tells_push_from_pull_and_refuses_nonsense(served, tmp_path):
    server, root, token = served
    random_file(tmp_path / "one", 12345)
    r = hsxfer.copy(tmp_path / "one", remote(server, "x"), port=server.port, token_file=token)
    assert r["operation"] == "push" and digest(root / "x") == digest(tmp_path / "one")
    with pytest.raises(ValueError, match="one side must be local|remote"):
        hsxfer.copy([remote(server, "x")], remote(server, "y"), port=server.port)
    with pytest.raises(ValueError, match="must be remote"):
        hsxfer.pull([str(tmp_path / "one")], remote(server, "y"), port=server.port)
    with pytest.raises(ValueError, match="channel count 0 is out of range"):
        hsxfer.push([str(tmp_path / "one")], remote(server, "y"), channels=0, port=server.port)


def test_a_wrong_token_raises_auth_error_with_the_cli_message(served, tmp_path):
    server, _, _ = served
    random_file(tmp_path / "one", 1000)
    other = write_token(tmp_path / "other-token")
    with pytest.raises(hsxfer.AuthError) as e:
        hsxfer.push([str(tmp_path / "one")], remote(server, "x"), port=server.port, token_file=other)
    assert "authentication refused" in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, hsxfer.Error)
    assert not isinstance(e.value, hsxfer.TransientError), "a retry would fail the same way"


def test_warnings_are_issued_when_the_transfer_then_fails(served, own_profiles, tmp_path):
    server, _, _ = served
    random_file(tmp_path / "one", 1000)
    own_profiles.mkdir(parents=True)
    (own_profiles / f"127.0.0.1_{server.port}_push.json").write_text("{ truncated")
    other = write_token(tmp_path / "other-token")
    with pytest.warns(UserWarning, match="profile .* is unreadable"):
        with pytest.raises(hsxfer.AuthError):
            hsxfer.push(str(tmp_path / "one"), remote(server, "x"), port=server.port,
                        token_file=other)


def test_a_failed_transfer_warns_of_what_its_report_would_have_noted(served, tmp_path):
    server, root, token = served
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f").write_bytes(b"a file where the server has a directory")
    os.mkfifo(tree / "p")
    (root / "bad" / "tree" / "f").mkdir(parents=True)
    with pytest.warns(UserWarning, match="not copied"):
        with pytest.raises(hsxfer.Error, match="cannot overwrite directory"):
            hsxfer.push(str(tree), remote(server, "bad/"), recursive=True, port=server.port,
                        token_file=token)


def test_messages_name_python_keywords_not_rust_items(tmp_path):
    random_file(tmp_path / "one", 1000)
    with hsxfer.Server(tmp_path) as s:
        with pytest.raises(hsxfer.ConnectError) as e:
            hsxfer.push(str(tmp_path / "one"), "127.0.0.1:x", port=s.port, encrypt=False)
    message = str(e.value)
    assert "encrypt=False" in message and "allow_clear=True" in message, message
    assert "::" not in message, message


def test_nothing_listening_raises_connect_error(tmp_path):
    random_file(tmp_path / "one", 1000)
    with hsxfer.Server(tmp_path) as s:
        port = s.port
    with pytest.raises(hsxfer.ConnectError, match="cannot connect"):
        hsxfer.push([str(tmp_path / "one")], "127.0.0.1:x", port=port)


def test_a_server_without_token_is_refused_off_loopback(tmp_path):
    with pytest.raises(ValueError, match="only allowed on a loopback address"):
        hsxfer.Server(tmp_path, listen="0.0.0.0")


def test_an_interrupted_push_resumes(served, tmp_path):
    """A callback that raises stops the copy; the same copy again sends only what is missing."""
    server, root, token = served
    size = 96 << 20
    random_file(tmp_path / "big", size)

    class Stop(Exception):
        pass

    def stop_at_a_third(p):
        if p["bytes"] >= size // 3:
            raise Stop()

    with pytest.raises(Stop):
        # 2 channels paced at 80 Mbit/s each: about 5 s for the whole file.
        hsxfer.push([str(tmp_path / "big")], remote(server, "big"), channels=2, pace=80_000_000,
                    tune="off", port=server.port, token_file=token, progress=stop_at_a_third,
                    interval=0.05)
    assert not (root / "big").exists(), "an interrupted file appeared under its final name"
    # The server may still be closing the first session (it holds the partial file's lock).
    deadline = time.monotonic() + 20
    while True:
        try:
            report = hsxfer.push([str(tmp_path / "big")], remote(server, "big"), port=server.port,
                                 token_file=token)
            break
        except hsxfer.Error as e:
            if "another transfer" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert report["verified"] is True
    assert report["bytes_resumed"] > 0, report
    assert report["bytes"] < size
    assert digest(root / "big") == digest(tmp_path / "big")


def test_ctrl_c_stops_a_copy_whose_progress_comes_rarely(served, tmp_path):
    """Ctrl-C stops a copy at once even when its progress is asked for every ten minutes."""
    server, root, token = served
    random_file(tmp_path / "big", 64 << 20)
    # A process started in the background (as CI may start it) ignores SIGINT, and then
    # interrupt_main does nothing: Ctrl-C's handler is put in place for this test.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.5, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            # 2 channels paced at 64 Mbit/s each: about 4 s for the whole file.
            hsxfer.push([str(tmp_path / "big")], remote(server, "big"), channels=2,
                        pace=64_000_000, tune="off", port=server.port, token_file=token,
                        progress=lambda p: None, interval=600)
    finally:
        signal.signal(signal.SIGINT, before)
    # Had the interrupt waited for the copy's end, the file would be there.
    assert not (root / "big").exists()


def start_paced_push(tmp_path, root, server):
    """Starts a push of a 64 MiB file into ``server`` on a thread (2 channels paced at
    64 Mbit/s each: about 4 s), and returns once part of it has arrived in ``root``: the
    thread, and the dict its ``hsxfer.Error`` goes into (``error``)."""
    random_file(tmp_path / "big", 64 << 20)
    failed = {}

    def push():
        try:
            hsxfer.push([str(tmp_path / "big")], remote(server, "big"), channels=2,
                        pace=64_000_000, tune="off", port=server.port)
        except hsxfer.Error as e:
            failed["error"] = e

    worker = threading.Thread(target=push)
    worker.start()
    deadline = time.monotonic() + 20
    while not any(p.name.endswith("hsxfer-part") and p.stat().st_size > 0
                  for p in root.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return worker, failed


def test_a_stopped_server_tells_the_client_why(tmp_path):
    """Server.stop ends a running push with the server's reason, not a vanished peer, as an
    error a retry loop knows to retry."""
    root = tmp_path / "root"
    root.mkdir()
    server = hsxfer.Server(str(root))
    worker, failed = start_paced_push(tmp_path, root, server)
    server.stop("maintenance")
    worker.join()
    assert "the server is stopping (maintenance)" in str(failed.get("error")), failed
    assert isinstance(failed["error"], hsxfer.TransientError), failed
    assert not (root / "big").exists()


def test_leaving_a_with_block_stops_the_sessions_it_served(tmp_path):
    """No client writes into the root after its ``with Server`` block: the sessions end as
    with ``stop``, the client told why."""
    root = tmp_path / "root"
    root.mkdir()
    with hsxfer.Server(str(root)) as server:
        worker, failed = start_paced_push(tmp_path, root, server)
    worker.join()
    assert "the server is stopping (the server was closed)" in str(failed.get("error")), failed
    assert not (root / "big").exists()


def test_an_exception_from_the_last_progress_call_keeps_the_report(served, tmp_path,
                                                                   monkeypatch):
    server, root, token = served
    random_file(tmp_path / "f", 100_000)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def fails(p):
        raise RuntimeError(f"callback failed at {p['bytes']} bytes")

    # An hour between calls: the only one is the last, once the copy is done.
    report = hsxfer.push([str(tmp_path / "f")], remote(server, "f"), interval=3600,
                         progress=fails, port=server.port, token_file=token)
    assert report["verified"] and report["bytes"] == 100_000
    assert digest(root / "f") == digest(tmp_path / "f")
    assert [str(u.exc_value) for u in unraisable] == ["callback failed at 100000 bytes"]


def test_the_gil_is_released_while_a_transfer_runs(served, tmp_path):
    server, _, token = served
    random_file(tmp_path / "f", 24 << 20)
    done = {}

    def transfer():
        t = time.monotonic()
        # One channel paced at 64 Mbit/s: about 3 s; no progress callback, so the thread
        # never takes the GIL back until the end, unless it never let it go.
        hsxfer.push([str(tmp_path / "f")], remote(server, "f"), channels=1, pace=64_000_000,
                    tune="off", port=server.port, token_file=token)
        done["seconds"] = time.monotonic() - t

    worker = threading.Thread(target=transfer)
    worker.start()
    ticks = 0
    while worker.is_alive():
        ticks += 1
        time.sleep(0.001)
    worker.join()
    assert done["seconds"] > 1.0
    # Each tick is at least 1 ms: a held GIL would allow a handful per 0.5 s wait.
    assert ticks > 200 * done["seconds"], (ticks, done)


def test_bench_moves_generated_data(served):
    server, _, token = served
    r = hsxfer.bench("127.0.0.1", bytes=32 << 20, channels=2, port=server.port, token_file=token)
    assert r["operation"] == "bench-upload" and r["bytes"] >= 32 << 20
    r = hsxfer.bench("127.0.0.1", direction="download", bytes=8 << 20, port=server.port,
                     token_file=token)
    assert r["operation"] == "bench-download" and r["bytes"] >= 8 << 20
    with pytest.raises(ValueError, match="not both"):
        hsxfer.bench("127.0.0.1", bytes=1, seconds=1, port=server.port, token_file=token)
    with pytest.raises(ValueError, match="direction"):
        hsxfer.bench("127.0.0.1", direction="sideways", port=server.port, token_file=token)


def test_probe_saves_a_profile_that_the_next_copy_starts_from(served, own_profiles, tmp_path):
    server, root, token = served
    r = hsxfer.probe("127.0.0.1", port=server.port, token_file=token, budget=6)
    assert r["direction"] == "push" and r["rtt_ms"] >= 0
    assert r["candidates"], r
    assert r["profile"] and os.path.dirname(r["profile"]) == str(own_profiles), r["profile"]
    random_file(tmp_path / "f", 1 << 20)
    copied = hsxfer.push(str(tmp_path / "f"), remote(server, "f"), port=server.port,
                         token_file=token)
    origin = copied["tuning"]["origin"]
    assert origin and origin[0].startswith("profile ("), origin
    # Without the profile (tune="off"), nothing comes from it.
    plain = hsxfer.push(str(tmp_path / "f"), remote(server, "g"), port=server.port,
                        token_file=token, tune="off")
    assert plain["tuning"]["origin"] == [], plain["tuning"]
    with pytest.raises(ValueError, match="tune"):
        hsxfer.push(str(tmp_path / "f"), remote(server, "h"), port=server.port, tune="sometimes")
    with pytest.raises(ValueError, match="too short"):
        hsxfer.probe("127.0.0.1", port=server.port, token_file=token, budget=0.5)


def test_a_token_file_inside_the_root_is_refused(tmp_path):
    token = write_token(tmp_path / "token")
    with pytest.raises(ValueError, match="inside the served root"):
        hsxfer.Server(tmp_path, token_file=token)


def test_mptcp_channels_when_both_ends_ask(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    src = tmp_path / "data.bin"
    random_file(src, 3 << 20)
    with hsxfer.Server(root, mptcp=True) as server:
        r = hsxfer.push(src, "127.0.0.1:data.bin", port=server.port, channels=2, mptcp=True)
        # Paths are checked before anything connects: words that are no address, and
        # addresses this host does not have.
        with pytest.raises(ValueError, match="'eth1' is not an IP address"):
            hsxfer.push(src, "127.0.0.1:x", port=server.port, mptcp=True,
                        mptcp_paths=["127.0.0.1", "eth1"])
        if os.geteuid() == 0:
            with pytest.raises(ValueError, match="192.0.2.7 is not an address of this host"):
                hsxfer.push(src, "127.0.0.1:x", port=server.port, mptcp=True,
                            mptcp_paths="192.0.2.7")
    assert r["transport"] == "mptcp"
    assert r["verified"]
    assert digest(root / "data.bin") == digest(src)
    assert not (root / "x").exists()


def test_copies_are_encrypted_and_the_server_key_is_checked(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    src = tmp_path / "f"
    random_file(src, 1 << 20)
    with hsxfer.Server(root, allow_clear=True) as server:
        r = hsxfer.push(src, "127.0.0.1:a", port=server.port, channels=2)
        assert r["encrypted"] and r["cipher_suite"] == "TLS13_AES_128_GCM_SHA256", r
        known = (tmp_path / "config" / "hsxfer" / "known_servers").read_text()
        assert known == f"127.0.0.1:{server.port} {server.fingerprint}\n"
        pinned = hsxfer.push(src, "127.0.0.1:b", port=server.port,
                             server_fingerprint=server.fingerprint)
        assert pinned["encrypted"]
        clear = hsxfer.push(src, "127.0.0.1:c", port=server.port, encrypt=False)
        assert not clear["encrypted"] and clear["cipher_suite"] is None
        with hsxfer.Server(tmp_path / "root", key_file=tmp_path / "other.pem") as other:
            assert other.fingerprint != server.fingerprint
            with pytest.raises(hsxfer.AuthError, match="presents the key"):
                hsxfer.push(src, "127.0.0.1:d", port=server.port,
                            server_fingerprint=other.fingerprint)
        with pytest.raises(ValueError, match="not a server fingerprint"):
            hsxfer.push(src, "127.0.0.1:e", port=server.port, server_fingerprint="MD5:00")
    for name in "abc":
        assert digest(root / name) == digest(src)


def _push_in_child(source, port, token):
    return hsxfer.push(source, "127.0.0.1:from-child", port=port, token_file=token)["verified"]


def test_a_forked_worker_copies_after_its_parent_did(served, tmp_path):
    """A child forked once the parent's runtime runs (``multiprocessing`` on Linux) gets a
    runtime of its own: the parent's had no threads there, and every call hung."""
    server, root, token = served
    random_file(tmp_path / "f", 1 << 20)
    hsxfer.push(str(tmp_path / "f"), remote(server, "from-parent"), port=server.port,
                token_file=token)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        verified = pool.apply_async(_push_in_child, (str(tmp_path / "f"), server.port, str(token)))
        assert verified.get(timeout=60) is True
    assert digest(root / "from-child") == digest(tmp_path / "f")


def test_a_path_object_is_local_even_with_a_colon(served, tmp_path, monkeypatch):
    server, root, token = served
    monkeypatch.chdir(tmp_path)
    random_file(tmp_path / "run:1.h5", 1000)
    r = hsxfer.push(pathlib.Path("./run:1.h5"), remote(server, "x"), port=server.port,
                    token_file=token)
    assert r["verified"] and digest(root / "x") == digest(tmp_path / "run:1.h5")
    back = tmp_path / "back:1"
    back.mkdir()
    r = hsxfer.copy(remote(server, "x"), pathlib.Path("back:1"), port=server.port,
                    token_file=token)
    assert r["operation"] == "pull" and digest(back / "x") == digest(tmp_path / "run:1.h5")


@pytest.mark.parametrize("bad", [dict(channels=-1), dict(channels=70000), dict(port=70000),
                                 dict(block_size=1.5), dict(rate="fast"), dict(pace=-8)])
def test_numbers_out_of_range_raise_value_error(served, tmp_path, bad):
    server, _, token = served
    random_file(tmp_path / "f", 10)
    kw = {"port": server.port, "token_file": token, **bad}
    with pytest.raises(ValueError, match="out of range|not a whole number"):
        hsxfer.push(str(tmp_path / "f"), remote(server, "x"), **kw)


def test_a_whole_float_rate_is_taken_and_ports_are_checked(served, tmp_path):
    server, _, token = served
    random_file(tmp_path / "f", 10)
    r = hsxfer.push(str(tmp_path / "f"), remote(server, "x"), port=server.port, token_file=token,
                    rate=10e9)
    assert r["verified"]
    with pytest.raises(ValueError, match="port 70000 is out of range"):
        hsxfer.probe("127.0.0.1", port=70000)
    with pytest.raises(ValueError, match="port -1 is out of range"):
        hsxfer.Server(tmp_path, port=-1)
