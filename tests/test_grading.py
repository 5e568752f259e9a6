"""The hidden-test machinery: wire format, comparison, determinism, and the defences against cheating."""
import io
import os

import numpy as np
import pytest
import torch

from attncourse import _wire, autograde
from attncourse_ref import attention as ref
from attncourse_ref.grading import Case, compare, seed_for


def test_wire_round_trip_never_pickles():
    buf = io.BytesIO()
    arrays = {"a": np.arange(6).reshape(2, 3), "b": np.array([True, False])}
    _wire.send(buf, {"x": [1, None, "s"]}, arrays)
    buf.seek(0)
    meta, got = _wire.recv(buf)
    assert meta == {"x": [1, None, "s"]}
    assert all(np.array_equal(got[k], arrays[k]) for k in arrays)
    with pytest.raises(ValueError):
        _wire.pack({}, {"o": np.array([object()], dtype=object)})


def _case(expected):
    return Case({"kind": "function", "args": [], "kwargs": {}}, {}, expected, "(test)")


def test_compare_explains_shape_dtype_and_value_errors():
    e = [np.ones((2, 3), dtype=np.float32)]
    assert compare(_case(e), [np.ones((2, 3), dtype=np.float32)]) is None
    assert "shape" in compare(_case(e), [np.ones((3, 2), dtype=np.float32)])
    assert "dtype" in compare(_case(e), [np.ones((2, 3), dtype=np.float64)])
    assert "max abs error" in compare(_case(e), [np.full((2, 3), 1.01, dtype=np.float32)])
    assert "expected 1 returned" in compare(_case(e), [])
    b = [np.array([[True, False]])]
    assert "bool" in compare(_case(b), [np.array([[1.0, 0.0]])])
    assert "differ" in compare(_case(b), [np.array([[True, True]])])
    assert "NaN" in compare(_case(e), [np.full((2, 3), np.nan, dtype=np.float32)])
    i = [np.array([3, 1], dtype=np.int64)]                    # integer results: values and dtype
    assert compare(_case(i), [np.array([3, 1], dtype=np.int64)]) is None
    assert "integer result" in compare(_case(i), [np.array([3.0, 1.0])])
    assert "integer result" in compare(_case(i), [np.array([3, 1], dtype=np.int32)])
    assert compare(_case([np.asarray(7)]), [np.asarray(7.0)]) is not None      # a Python float for an int


def test_client_checks_inputs_generators_and_training_mode():
    """Function cases fail a submission that changes its inputs in place; a generator crosses the wire as
    its seed (a fresh one on the other side); module cases with train_seed run in training mode."""
    from attncourse_ref.grading import function_case, judged_case, module_case
    x = torch.arange(4.0, dtype=torch.float64)
    case = function_case(torch.neg, [x])

    def neg_in_place(t):
        return t.neg_()
    with pytest.raises(autograde.InputChanged):
        autograde._run_case(0, case.call, {f"c0/{k}": v for k, v in case.arrays.items()}, neg_in_place)
    g = _wire.decode_value(_wire.encode_value(torch.Generator().manual_seed(42), {}, "g"), {}, "p")
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=torch.Generator().manual_seed(42)))
    rand = judged_case([torch.Generator().manual_seed(1)], judge=lambda got: None, repeat=2)
    arrays = {f"c0/{k}": v for k, v in rand.arrays.items()}
    same = autograde._run_case(0, rand.call, arrays, lambda gen: torch.rand(5, generator=gen))
    assert rand.judge(same) is None
    assert "same seed" in rand.judge(autograde._run_case(0, rand.call, arrays, lambda gen: torch.rand(5)))
    drop = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Dropout(0.5)).double()
    train = module_case(drop, {}, [torch.ones(3, 6, dtype=torch.float64)], train_seed=7)
    assert not drop.training and (train.expected[0] == 0).any()         # dropout was active, then eval again
    got = autograde._run_case(0, train.call, {f"c0/{k}": v for k, v in train.arrays.items()},
                              lambda: torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Dropout(0.5)))
    assert compare(train, got) is None


def test_cases_are_reproducible_and_salted(monkeypatch):
    a = seed_for("ch02.causal_mask")
    assert a == seed_for("ch02.causal_mask") != seed_for("ch02.sdpa_masked")
    monkeypatch.setenv("ATTNCOURSE_GRADING_SALT", "spring-2027")
    assert seed_for("ch02.causal_mask") != a


def test_reference_passes_and_stub_fails_every_hidden_test_of_ch02():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    for test_id, candidate in [("ch02.sdpa_unmasked", ref.scaled_dot_product_attention),
                               ("ch02.sdpa_masked", ref.scaled_dot_product_attention),
                               ("ch02.causal_mask", ref.causal_mask),
                               ("ch02.self_attention", ref.SelfAttention),
                               ("ch02.cross_attention", ref.CrossAttention),
                               ("ch02.equivariance_gap", ref.equivariance_gap)]:
        assert autograde.run_hidden_test(test_id, candidate)["failures"] == [], test_id
        failures = autograde.run_hidden_test(test_id, stub)["failures"]
        assert failures and "not done yet" in failures[0], test_id


def test_unknown_hidden_test_is_a_clear_error():
    with pytest.raises(RuntimeError, match="unknown hidden test"):
        autograde.run_hidden_test("ch02.no_such_test", ref.causal_mask)


def test_patched_comparisons_in_the_kernel_do_not_change_the_verdict(monkeypatch):
    from tests_zoo_helpers import wrong_sdpa
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(torch, "equal", lambda *a, **k: True)
    monkeypatch.setattr(torch.testing, "assert_close", lambda *a, **k: None)
    monkeypatch.setattr(np, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(np, "array_equal", lambda *a, **k: True)
    monkeypatch.setattr(torch, "randn", lambda *a, **k: torch.zeros(*a))
    assert autograde.run_hidden_test("ch02.sdpa_unmasked", wrong_sdpa)["failures"]


def test_grade_refuses_a_kernel_that_imported_the_reference():
    # This test process has imported attncourse_ref, exactly like a cheating submission.
    with pytest.raises(AssertionError, match="imported the course's reference package"):
        autograde.grade("ch02.causal_mask", ref.causal_mask)


def test_reference_watch_sees_calls_into_the_reference():
    watch = autograde._ReferenceWatch()
    with watch.watching():
        torch.ones(2).sum()
    assert watch.hit is None
    with watch.watching():
        ref.causal_mask(3)
    assert watch.hit == "causal_mask"


def test_grading_kernel_cannot_import_the_reference():
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-c", "import attncourse_ref"], capture_output=True, text=True,
                         env={"ATTNCOURSE_GRADING_KERNEL": "1", "PATH": ""})
    assert res.returncode != 0 and "not available to a submission" in res.stderr


def test_warnings_from_the_submission_stay_off_stderr(capfd):
    import warnings

    def noisy(n, device=None):
        warnings.warn("harmless", UserWarning)
        import sys
        print("to stderr", file=sys.stderr)
        return ref.causal_mask(n, device)

    assert autograde.run_hidden_test("ch02.causal_mask", noisy)["failures"] == []
    assert capfd.readouterr().err == ""


# ---- "from scratch" is judged by the operators that run, whatever their spelling (issue 20) --------
from attncourse_ref import moe, transformer  # noqa: E402

def _aten_spellings():

    class LayerNormViaATen(transformer.LayerNorm):
        def forward(self, x):
            return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], self.weight, self.bias, self.eps)[0]

    class RMSNormViaATen(moe.RMSNorm):
        def forward(self, x):
            return torch.ops.aten.rms_norm(x, [x.shape[-1]], self.weight, self.eps)

    def math_kernel(q, k, v, mask=None):
        if mask is None:
            out, w = torch.ops.aten._scaled_dot_product_attention_math(q, k, v)
        else:
            out, w = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)
        return out, w

    return [
        ("ch00.softmax", lambda x, dim=-1, temperature=1.0: torch.ops.aten._softmax(x / temperature, dim, False)),
        ("ch00.softmax", lambda x, dim=-1, temperature=1.0: torch.nn.functional.softmin(-x / temperature, dim)),
        ("ch00.softmax_temperature", lambda x, dim=-1, temperature=1.0: torch.log_softmax(x / temperature, dim).exp()),
        ("ch00.cosine_similarity", lambda a, b, dim=-1, eps=1e-8: torch.ops.aten.cosine_similarity(a, b, dim, eps)),
        ("ch02.sdpa_unmasked", math_kernel),
        ("ch03.tiled_attention", lambda q, k, v, block_size, causal=False:
            torch.ops.aten._scaled_dot_product_attention_math(q, k, v, is_causal=causal)[0]),
        ("ch05.layer_norm", LayerNormViaATen),
        ("ch08.rms_norm", RMSNormViaATen),
        # Routes no denylist named (issue 29, item 5): each exercise's allowlist refuses them by construction.
        ("ch00.softmax", lambda x, dim=-1, temperature=1.0:
            torch._masked_softmax(x / temperature, torch.zeros(x.shape, dtype=torch.bool), dim % x.dim(), 0)),
        ("ch02.sdpa_unmasked", mha_forward),
        ("ch05.layer_norm", LayerNormViaRMSNorm),
        ("ch05.label_smoothed_loss", smoothing_by_probability_targets),
        ("ch09.cross_entropy", lambda logits, targets, ignore_index=-100:
            (torch.logcumsumexp(logits.double(), -1)[..., -1] - logits.double().gather(-1, targets.clamp_min(0)
                                                                                    .unsqueeze(-1))[..., 0])
            [targets != ignore_index].mean().to(logits.dtype)),
    ]


def mha_forward(q, k, v, mask=None):
    """PyTorch's multi-head attention with one head and identity projections: attention itself (q, k and v
    padded with zeros to one width, q rescaled so that the scores keep their sqrt(d_k))."""
    import math
    import torch.nn.functional as F
    dk, dv, width = q.shape[-1], v.shape[-1], max(q.shape[-1], v.shape[-1])
    lead = q.shape[:-2]

    def seq_first(t, scale=1.0):
        t = F.pad(t * scale, (0, width - t.shape[-1]))
        return t.reshape(-1, *t.shape[-2:]).transpose(0, 1)
    eye, zeros = torch.eye(width, dtype=q.dtype), torch.zeros(3 * width, dtype=q.dtype)
    out, w = F.multi_head_attention_forward(seq_first(q, math.sqrt(width / dk)), seq_first(k), seq_first(v), width, 1,
                                            torch.cat([eye, eye, eye]), zeros, None, None, False, 0.0, eye,
                                            zeros[:width], need_weights=True)
    out = out.transpose(0, 1)[..., :dv]
    return out.reshape(*lead, *out.shape[-2:]), w.reshape(*lead, *w.shape[-2:])


class LayerNormViaRMSNorm(transformer.LayerNorm):
    """Layer normalisation is RMS normalisation of the centred input."""
    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return torch.nn.functional.rms_norm(centred, (x.shape[-1],), self.weight, self.eps) + self.bias


def smoothing_by_probability_targets(logits, target, smoothing, pad=0):
    """F.cross_entropy given the smoothed distribution as probability targets: never reaches nll_loss."""
    V = logits.shape[-1]
    probs = torch.full(logits.shape, smoothing / V, dtype=logits.dtype)
    probs.scatter_add_(-1, target.unsqueeze(-1), torch.full(target.unsqueeze(-1).shape, 1 - smoothing, dtype=logits.dtype))
    keep = target != pad
    return torch.nn.functional.cross_entropy(logits[keep], probs[keep])


@pytest.mark.parametrize("case", range(13))
def test_a_forbidden_operator_fails_whatever_its_spelling(case):
    from attncourse.autograde import run_hidden_test
    test_id, candidate = _aten_spellings()[case]
    verdict = run_hidden_test(test_id, candidate)
    assert verdict["failures"] and any("must be written from scratch" in f and "may not call" in f
                                       for f in verdict["failures"]), verdict["failures"][:2]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="a memory cgroup needs root")
def test_the_peak_memory_of_a_kernel_counts_a_child_that_computed_and_exited():
    """A kernel that computes in a child process does not escape the tiled-attention memory bound:
    the grading server reads the peak of the kernel's memory cgroup, children included."""
    import json
    import subprocess
    import sys
    from attncourse import sandbox
    from attncourse_ref.grading.__main__ import PeakMemory
    if "memory" not in sandbox._cgroup_bases():
        pytest.skip("no memory cgroup controller on this machine")
    code = """
import json, os, sys
from attncourse import sandbox
print(json.dumps(sandbox._make_cgroups()), flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    bytearray(200 << 20)             # 200 MiB, written (zeroed) by the child, which then exits
    os._exit(0)
os.waitpid(pid, 0)
print("done", flush=True)
sys.stdin.readline()
"""
    kernel = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        cgroups = json.loads(kernel.stdout.readline())
        assert "memory" in cgroups, cgroups
        whole, alone = PeakMemory(kernel.pid, cgroups["memory"]), PeakMemory(kernel.pid)
        whole.start(), alone.start()
        kernel.stdin.write("go\n")
        kernel.stdin.flush()
        assert kernel.stdout.readline().strip() == "done"
        grown, grown_alone = whole.stop(), alone.stop()
        assert grown > 150 << 20, f"the cgroup saw {grown / 2**20:.1f} MiB"
        assert grown_alone < 50 << 20        # what the per-process fallback misses (the README says so)
    finally:
        kernel.kill()
        kernel.wait()
        for path in set(cgroups.values()):
            os.rmdir(path)


def test_a_grading_kernel_gets_only_the_environment_it_needs():
    """Nothing of the grader's environment reaches a student's code: a password, the gradebook's URL, the
    course's grading salt and the grading server's control socket are left out; what the kernel needs stays."""
    from attncourse.sandbox import kernel_environment
    grader = {"PATH": "/usr/bin", "HOME": "/tmp/home", "LC_ALL": "C.UTF-8", "PGPASSWORD": "secret",
              "NBGRADER_DB_URL": "postgresql://u:secret@db/gradebook", "ATTNCOURSE_GRADING_SALT": "term-2026",
              "ATTNCOURSE_GRADER_CONTROL": "/tmp/x/control.sock", "AWS_SECRET_ACCESS_KEY": "secret",
              "ATTNCOURSE_GRADING_KERNEL": "1", "ATTNCOURSE_GRADING_SOCKET": "/tmp/k.sock",
              "ATTNCOURSE_GRADING_TOKEN": "t", "ATTNCOURSE_LANGUAGE": "zh", "OMP_NUM_THREADS": "1"}
    kept = kernel_environment(grader)
    assert set(kept) == {"PATH", "HOME", "LC_ALL", "ATTNCOURSE_GRADING_KERNEL", "ATTNCOURSE_GRADING_SOCKET",
                         "ATTNCOURSE_GRADING_TOKEN", "ATTNCOURSE_LANGUAGE", "OMP_NUM_THREADS"}
    assert "secret" not in repr(kept) and "term-2026" not in repr(kept)
    # What a fork of the kernels' zygote is sent: the same, and where the launcher finds the control socket.
    from attncourse.sandbox import launcher_environment
    sent = launcher_environment(grader)
    assert set(sent) == set(kept) | {"ATTNCOURSE_GRADER_CONTROL"}
    assert "secret" not in repr(sent) and "term-2026" not in repr(sent)


def test_the_kernels_zygote_answers_the_grader_only_and_forks_a_kernel_that_runs(tmp_path):
    """attncourse.zygote forks a kernel for an unconfined caller (the grader's provisioner), with the stdout it
    was given and the environment it was sent; a caller that gave up privileges (as every confined kernel has)
    gets no answer, and the zygote goes on; it ends when its standard input closes."""
    import ctypes
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path
    from attncourse.zygote import request_kernel
    path = str(Path(tempfile.mkdtemp(prefix="attncourse-z-")) / "zygote.sock")
    zygote = subprocess.Popen([sys.executable, "-m", "attncourse.zygote", path], stdin=subprocess.PIPE)
    try:
        for _ in range(600):
            if os.path.exists(path) or zygote.poll() is not None:
                break
            time.sleep(0.05)
        confined = subprocess.run([sys.executable, "-c", f"""
import ctypes, sys
assert ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0) == 0      # PR_SET_NO_NEW_PRIVS, as a kernel
from attncourse.zygote import request_kernel
try:
    request_kernel({path!r}, ["-f", "x.json"], {{}}, "/", [0, 1, 2])
except RuntimeError as exc:
    print("refused:", exc)
"""], capture_output=True, text=True, timeout=60)
        assert "refused:" in confined.stdout, confined.stdout + confined.stderr
        # A kernel whose connection file does not exist still forks, reads the request, and fails where a
        # launched kernel would: its error reaches the stderr it was given.
        err = tmp_path / "stderr"
        with open(err, "w") as f, open(os.devnull) as null:
            pid = request_kernel(path, ["-f", str(tmp_path / "missing.json")], {"PATH": os.environ["PATH"],
                                 "ATTNCOURSE_SANDBOX_TMP": str(tmp_path / "tmp")}, str(tmp_path),
                                 [null.fileno(), f.fileno(), f.fileno()])
        for _ in range(600):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        assert "missing.json" in err.read_text(), err.read_text()
        assert zygote.poll() is None
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=30)
    assert zygote.returncode == 0


def test_the_class_server_survives_any_client_of_its_control_socket(tmp_path):
    """A client that connects and hangs up, or sends one byte and waits, neither stops nor holds the class
    grader's server: a kernel launcher's request right after is answered at once, on a channel that lives in
    a folder of its own (the folder a confined kernel is shown), not beside the control socket."""
    import json
    import socket
    import subprocess
    import sys
    import time
    import tempfile
    from pathlib import Path
    control = Path(tempfile.mkdtemp(prefix="attncourse-grader-")) / "control.sock"    # a short path, as the grader's
    server = subprocess.Popen([sys.executable, "-I", "-m", "attncourse_ref.grading", "--serve", str(control),
                               "--root", str(tmp_path)], stdin=subprocess.PIPE)
    try:
        for _ in range(600):
            if control.exists() or server.poll() is not None:
                break
            time.sleep(0.05)
        for _ in range(5):                                   # connect and hang up
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(control))
        jam = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        jam.connect(str(control))
        jam.send(b"x")                                       # one byte of a request, then nothing
        t0 = time.monotonic()
        folder = tmp_path / "autograded" / "student" / "ch02"
        folder.mkdir(parents=True)
        # The launcher: a process of its own, as the server watches (and in the end kills) whoever asked.
        launcher = subprocess.Popen([sys.executable, "-c", f"""
import json, socket, sys, time
from attncourse import _wire
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect({str(control)!r})
_wire.send(s.makefile("wb"), {{"open": {str(folder)!r}, "tmp": {str(tmp_path / "tmp")!r}}})
print(json.dumps(_wire.recv(s.makefile("rb"))[0]), flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
        reply = json.loads(launcher.stdout.readline())
        assert time.monotonic() - t0 < 15, "the server was held by a silent client"
        assert os.path.dirname(reply["socket"]) == str(control.parent / "channels")
        assert server.poll() is None
        jam.close()
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        import shutil
        shutil.rmtree(control.parent, ignore_errors=True)


def test_a_case_builder_that_raises_is_a_grading_error_and_the_session_goes_on(tmp_path):
    """One hidden test whose cases cannot be built is reported as the grader's error (in the record too), and
    the kernel's next hidden test is served as usual."""
    import json
    import socket
    import threading
    from attncourse_ref.grading import REGISTRY
    from attncourse_ref.grading import __main__ as server
    server.load_chapters()
    REGISTRY["ch99.broken"] = lambda rng: 1 / 0
    try:
        a, b = socket.socketpair()
        record = open(tmp_path / "record.jsonl", "a+")
        def serve():
            try:
                server.session(a.makefile("rb"), a.makefile("wb"), None, record)
            except EOFError:            # the client hangs up in the middle of its second test, as it may
                pass
        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        rfile, wfile = b.makefile("rb"), b.makefile("wb")
        _wire.send(wfile, {"test": "ch99.broken"})
        reply, _ = _wire.recv(rfile)
        assert "grading error" in reply["error"] and "ZeroDivisionError" in reply["error"]
        _wire.send(wfile, {"test": "ch02.causal_mask"})
        reply, _ = _wire.recv(rfile)
        assert reply["cases"]                                   # still serving
        b.shutdown(socket.SHUT_RDWR)        # the reader and writer files hold the socket open: close() is no EOF
        b.close()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the session did not end when its client hung up"
        entries = [json.loads(line) for line in open(tmp_path / "record.jsonl")]
        assert any(e.get("grading_error", "").startswith("ZeroDivisionError") for e in entries)
    finally:
        del REGISTRY["ch99.broken"]


def test_a_course_draws_its_hidden_cases_with_a_secret_salt_of_its_own(tmp_path, monkeypatch):
    """Without ATTNCOURSE_GRADING_SALT the grader makes the course's salt once (random, readable by the grader
    alone) and keeps it: a regrade draws the same cases, another course others."""
    import stat

    import grade_class
    monkeypatch.delenv("ATTNCOURSE_GRADING_SALT", raising=False)
    first = grade_class.course_salt(tmp_path)
    assert len(first) == 32 and first == grade_class.course_salt(tmp_path)
    assert stat.S_IMODE((tmp_path / "grading_salt").stat().st_mode) == 0o600
    other = tmp_path / "other"
    other.mkdir()
    assert grade_class.course_salt(other) != first
    monkeypatch.setenv("ATTNCOURSE_GRADING_SALT", "term-2027")
    assert grade_class.course_salt(tmp_path) == "term-2027"


def test_what_a_submission_prints_during_a_hidden_test_is_not_kept(capsys):
    """A print of the hidden case's inputs would reach the autograded notebook and the feedback: the test
    cell shows the verdict alone."""
    def causal_mask(n, device=None):
        print("HIDDEN INPUT", n)
        return torch.ones(n, n, dtype=torch.bool, device=device).tril()
    verdict = autograde.run_hidden_test("ch02.causal_mask", causal_mask)     # what grade() runs
    out = capsys.readouterr()
    assert verdict["failures"] == [] and "HIDDEN INPUT" not in out.out + out.err


def test_the_class_server_builds_each_hidden_tests_cases_once(tmp_path):
    """Cases depend on the test and the salt alone: the class server keeps them for the run's later kernels
    (chapter 05's builders took seconds per student), and what it keeps is what a build gives."""
    from attncourse_ref.grading import REGISTRY
    from attncourse_ref.grading import __main__ as server
    server.load_chapters()
    calls = []
    original = REGISTRY["ch02.causal_mask"]
    REGISTRY["ch02.causal_mask"] = lambda rng: calls.append(1) or original(rng)
    server.CASE_CACHE = str(tmp_path)
    try:
        first, second = server.build_cases("ch02.causal_mask"), server.build_cases("ch02.causal_mask")
    finally:
        REGISTRY["ch02.causal_mask"], server.CASE_CACHE = original, None
    assert len(calls) == 1
    assert [c.call for c in first] == [c.call for c in second]
    for a, b in zip(first, second):
        assert a.arrays.keys() == b.arrays.keys() and all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)


@pytest.mark.parametrize("case", range(8, 13))
def test_the_routes_no_denylist_named_earn_full_marks_without_the_allowlist(case, monkeypatch):
    """The test above can fail: without the allowlists these routes compute the right answer."""
    from attncourse import forbid
    from attncourse.autograde import run_hidden_test
    monkeypatch.setattr(forbid, "allowed", lambda name, allow: True)
    test_id, candidate = _aten_spellings()[case]
    assert run_hidden_test(test_id, candidate)["failures"] == []


def _allow_listed():
    import importlib
    from attncourse_ref.grading import ALLOW
    for chapter in ("ch00", "ch02", "ch03", "ch05", "ch08", "ch09"):
        importlib.import_module(f"attncourse_ref.grading.{chapter}")
    return sorted(t for t, allow in ALLOW.items() if allow is not None)


def _reference_for(test_id):
    """The reference the solution cell tested by ``test_id`` names (its class, for a method)."""
    import fakeclass
    import nbtools
    from test_zoo import reference_target
    chapter, name = test_id.split(".")
    solution = next(s for s, tests in fakeclass.cells_tested(nbtools.read(nbtools.chapter_notebook(chapter))).items()
                    if f"test_{name}" in tests)
    target, cls = reference_target(chapter, solution)
    return cls or target


@pytest.mark.parametrize("test_id", _allow_listed())
def test_each_reference_runs_within_its_exercises_allowlist(test_id):
    """The allowlists are checked against the references' own trace: everything each reference calls, and the
    hidden test's harness around it, is allowed."""
    from attncourse.autograde import run_hidden_test
    assert run_hidden_test(test_id, _reference_for(test_id))["failures"] == []


def test_nbgrader_metadata_it_cannot_read_is_dropped_even_after_readable_copies(tmp_path):
    """restore_test_cells reads each distinct cell metadata with nbgrader once per run: a cell whose metadata
    nbgrader cannot read is dropped whatever the class's earlier notebooks held, and a readable one is kept."""
    import copy

    import grade_class
    import nbtools
    source = nbtools.read(nbtools.chapter_notebook("ch02"))
    name = nbtools.chapter_notebook("ch02").name
    broken = copy.deepcopy(source)
    at = next(i for i, c in enumerate(broken.cells) if nbtools.is_solution(c))
    del broken.cells[at].metadata["nbgrader"]["schema_version"]         # nbgrader refuses a cell without it
    for student, nb in (("first", source), ("second", broken), ("third", source)):
        nbtools.write(nb, tmp_path / "submitted" / student / "ch02" / name)
    assert grade_class.restore_test_cells("ch02", "first", tmp_path, source) == []
    notes = grade_class.restore_test_cells("ch02", "second", tmp_path, source)
    assert notes == [f"dropped unreadable nbgrader metadata of cell {at}"]
    assert "nbgrader" not in nbtools.read(tmp_path / "submitted" / "second" / "ch02" / name).cells[at].metadata
    assert grade_class.restore_test_cells("ch02", "third", tmp_path, source) == []


def test_the_quick_ready_client_waits_for_a_kernel_that_answers_and_leaves_iopub_as_it_was():
    """nbgrader's kernels start with attncourse.kernel_provisioner.QuickReadyClient (nbgrader_config.py): it returns
    only once the kernel answers on shell and iopub, and the first cell's output is the cell's own."""
    import asyncio

    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config

    import nbtools
    from attncourse.kernel_provisioner import QuickReadyClient
    config = Config()
    config.KernelManager.client_class = "attncourse.kernel_provisioner.QuickReadyClient"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('first')"), nbformat.v4.new_code_cell("1 + 1")])
    client = NotebookClient(nb, kernel_name="python3", config=config, shutdown_kernel="immediate")

    async def run():
        async with client.async_setup_kernel():
            assert isinstance(client.kc, QuickReadyClient)
            assert "get_msg" not in vars(client.kc.iopub_channel)      # the class's own method again
            for i, cell in enumerate(nb.cells):
                await client.async_execute_cell(cell, i)
    asyncio.run(run())
    assert [o.get("text") for o in nb.cells[0].outputs] == ["first\n"]
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "2"
    assert "QuickReadyClient" in (nbtools.ROOT / "nbgrader_config.py").read_text()
