"""Ctrl-C stops a next() that waits on a stalled download."""
import signal
import textwrap
import time

from sfutil import spawn_with_shards_stalled

CHILD = textwrap.dedent("""
    import json, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import shardfeed
    url, opts = sys.argv[1], json.loads(sys.argv[2])
    loader = shardfeed.Loader(url, **opts)
    print("ready", flush=True)
    try:
        b = loader.next_batch()
        print("got a batch", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    loader.close()
    print("closed", flush=True)
""")


def test_ctrl_c_interrupts_a_next_blocked_on_a_stalled_download(dataset, tmp_path):
    p = spawn_with_shards_stalled(dataset, tmp_path / "blocked.py", CHILD)
    try:
        assert p.stdout.readline().strip() == b"ready", p.stderr.read().decode()[-3000:]
        time.sleep(1.0)  # let it block in next() (the signal is honoured at any point)
        assert p.poll() is None, "the child ended before it was interrupted"
        p.send_signal(signal.SIGINT)
        # A hang check, not a timing threshold: a blocked next() that ignores
        # Ctrl-C would wait for the 10-minute stall.
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert dataset.mock.stats()["faults"].get("stall", 0) > 0  # it did wait on a stall
    lines = out.decode().split()
    assert lines == ["interrupted", "closed"], (lines, err.decode()[-3000:])
    assert p.returncode == 0, err.decode()[-3000:]
