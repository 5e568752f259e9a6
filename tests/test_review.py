"""Code that reaches for the grading machinery is held for review (tools/review.py); honest code never is."""
import inspect
import textwrap

import pytest

import nbtools
import review
from conftest import CHAPTERS
from fakeclass import zoo


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_reference_and_every_zoo_variant_reach_for_nothing(chapter):
    solved = nbtools.solve(nbtools.read(nbtools.chapter_notebook(chapter)),
                           nbtools.read(nbtools.chapter_notebook(chapter)), {})
    aliases = review.notebook_aliases(solved)
    found = [(nbtools.grade_info(c).get("grade_id"), hit) for c in solved.cells
             if c.cell_type == "code" and not nbtools.is_test(c) for hit in review.machinery(c.source, aliases)]
    found += [(v.name, hit) for v in zoo(chapter)
              for hit in review.machinery(textwrap.dedent(inspect.getsource(v.impl)), aliases)]
    assert not found, found


MACHINERY = {
    "torch's private switches": "import torch\nwith torch._C.DisableTorchFunction():\n    pass\n",
    "a private module": "from torch.utils._python_dispatch import _disable_current_modes\n",
    "a mode of its own": "from torch.overrides import TorchFunctionMode\n",
    "a function's globals": "import torch\nstep = torch.optim.Adam.__init__.__globals__['_single_tensor_adam']\n",
    "a code object": "from attncourse import autograde\nautograde.grade.__code__ = (lambda *a: None).__code__\n",
    "a module's namespace": "import attncourse.forbid as f\nvars(f)['forbidding'] = None\n",
    "a module attribute replaced": "from attncourse import forbid\nforbid.forbidding = None\n",
    "sys.modules": "import sys\nsys.modules['attncourse.forbid'].forbidding = None\n",
    "a computed name": "import torch.nn.functional as F\nfn = getattr(F, 'scaled_dot_' + 'product_attention')\n",
    "a private name": "import torch\nfn = getattr(torch, '_masked_softmax')\n",
    "frames": "import sys\nsys._getframe(0).f_globals['checks'] = None\n",
    "the object graph": "import gc\nobjs = gc.get_objects()\n",
    "ctypes": "import ctypes\n",
    "a module imported in another cell": "fn = F._canonical_mask\n",
}


@pytest.mark.parametrize("what", MACHINERY)
def test_each_route_to_the_machinery_is_found(what):
    assert review.machinery(MACHINERY[what], aliases={"F": "torch.nn.functional"}), what


def test_honest_code_with_private_attributes_of_its_own_is_not_held():
    honest = ("import torch\nclass Cache:\n    def __init__(self):\n        self._keys = None\n"
              "    def get(self, x):\n        return getattr(self, '_keys'), torch.softmax(x, -1), x.shape[-1]\n")
    assert review.machinery(honest) == []


def test_a_solution_cell_holds_its_own_tests_and_an_added_cell_every_later_test():
    import nbformat
    nb = nbformat.v4.new_notebook()

    def cell(gid, solution=False, grade=False):
        c = nbformat.v4.new_code_cell("")
        c.metadata["nbgrader"] = {"grade_id": gid, "solution": solution, "grade": grade, "locked": not solution}
        return c
    nb.cells = [cell("a", solution=True), cell("test_a", grade=True), cell("b", solution=True),
                cell("test_b1", grade=True), cell("test_b2", grade=True), nbformat.v4.new_code_cell(""),
                cell("c", solution=True), cell("test_c", grade=True)]
    assert review.held_cells(nb, [(2, "b", 1, "", "")]) == {"test_b1", "test_b2"}
    assert review.held_cells(nb, [(5, "cell 5", 1, "", "")]) == {"test_c"}
    assert review.held_cells(nb, [(0, "a", 1, "", "")]) == {"test_a"}


# nbgrader's add_submission trips SQLAlchemy 2's autoflush warnings inside nbgrader itself: not this test's concern
@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")
def test_points_are_held_released_and_let_go_by_a_regrade(tmp_path, monkeypatch):
    """Through a real nbgrader gradebook: a submission that reaches for the machinery has its exercise's points
    held (manual score 0), the instructor's release lets the automatic score stand, and a regrade of a clean
    submission lets go of what an earlier run held."""
    import nbformat
    from nbgrader.api import Gradebook
    monkeypatch.delenv("NBGRADER_DB_URL", raising=False)
    name = nbtools.chapter_notebook("ch02").stem

    def notebook(solution):
        nb = nbformat.v4.new_notebook()
        sol, test = nbformat.v4.new_code_cell(solution), nbformat.v4.new_code_cell("check(sdpa)")
        sol.metadata["nbgrader"] = {"grade_id": "sdpa", "solution": True, "grade": False, "locked": False}
        test.metadata["nbgrader"] = {"grade_id": "test_sdpa", "solution": False, "grade": True, "locked": True,
                                     "points": 2}
        nb.cells = [sol, test]
        return nb
    with Gradebook(nbtools.gradebook_url(tmp_path)) as gb:
        gb.add_assignment("ch02")
        gb.add_notebook(name, "ch02")
        gb.add_grade_cell("test_sdpa", name, "ch02", max_score=2, cell_type="code")
        gb.add_student("alice")
        gb.add_submission("ch02", "alice")
        gb.find_grade("test_sdpa", name, "ch02", "alice").auto_score = 2
        gb.db.commit()

    def score():
        with Gradebook(nbtools.gradebook_url(tmp_path)) as gb:
            return gb.find_grade("test_sdpa", name, "ch02", "alice").score
    release_nb = notebook("raise NotImplementedError()")
    hits, held = review.hold("ch02", tmp_path, "alice", notebook(MACHINERY["torch's private switches"]), release_nb)
    assert held == {"test_sdpa"} and hits and score() == 0
    assert review.release("ch02", tmp_path, "alice") == ["test_sdpa"] and score() == 2
    review.hold("ch02", tmp_path, "alice", notebook(MACHINERY["a computed name"]), release_nb)
    assert score() == 0
    hits, held = review.hold("ch02", tmp_path, "alice", notebook("def sdpa(q, k, v):\n    return q\n"), release_nb)
    assert not hits and not held and score() == 2
