"""In a grading kernel only (an IPython extension its kernelspec loads): a test cell whose visible check fails
still asks its hidden test, so that the grading server records the verdict and keeps what the code returned,
for the class report's diagnosis (tools/report.py).  The cell fails as before, with the check's message, and its
points are lost either way.  Code of the submission can switch this off and so leave its mistakes undiagnosed;
it cannot choose a diagnosis, which the server makes from what the code returns."""
import contextlib
import io
import re

_HIDDEN = re.compile(r'grade\("([\w.]+)",\s*(.+?)\)\s*$', re.M)


def load_ipython_extension(shell):
    from .checks import CheckFailed
    cell = {"source": ""}
    shell.events.register("pre_run_cell", lambda info: cell.update(source=getattr(info, "raw_cell", "") or ""))

    def ask_hidden_tests(shell, etype, value, tb, tb_offset=None):
        from .autograde import run_hidden_test
        for test_id, expr in _HIDDEN.findall(cell["source"]):
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    run_hidden_test(test_id, eval(expr, shell.user_ns))
            except Exception:           # the check's failure is what the cell reports (an interrupt stops the cell)
                pass
        # IPython leaves showing a custom exception's traceback to its handler: shown as any error is (ipykernel
        # sends it to the notebook as the cell's error output, which costs the cell its points).
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
        shell._showtraceback(etype, value, stb)
        return stb
    shell.set_custom_exc((CheckFailed,), ask_hidden_tests)
