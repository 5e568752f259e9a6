"""nbgrader configuration for the course (read by every `nbgrader ...` run from this folder)."""
import os

c = get_config()  # noqa: F821  (provided by nbgrader)

# Kernels started by nbgrader inherit this: the reference package refuses to import there,
# so a submission cannot use it.  The grading server is started without it.
os.environ["ATTNCOURSE_GRADING_KERNEL"] = "1"

c.CourseDirectory.course_id = "attention-transformers"
c.CourseDirectory.source_directory = "chapters"       # chapters/<chapter>/<notebook>.ipynb
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"   # submitted/<student>/<chapter>/
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
# Large classes: point the gradebook at PostgreSQL, e.g.
#   NBGRADER_DB_URL=postgresql://grader:secret@dbhost/attention_course make autograde CH=ch02
if os.environ.get("NBGRADER_DB_URL"):
    c.CourseDirectory.db_url = os.environ["NBGRADER_DB_URL"]

# Per cell.  The slowest cell of any chapter (a CPU training run) takes well under this; a
# submission that loops forever is interrupted here and grading goes on with the next cell.
c.Execute.timeout = int(os.environ.get("ATTNCOURSE_CELL_TIMEOUT", "120"))
# Stop each kernel at once when its notebook is done instead of asking it to exit: the graceful
# exit cost about 0.9 s per student (a torch-loaded interpreter tearing down), and nothing is lost:
# every verdict is on the grading server's record before the cell that asked for it ends.
c.Execute.shutdown_kernel = "immediate"
# A new kernel is ready to grade as soon as it answers: jupyter_client's client then drained iopub until 0.2 s
# passed with no message, every student (attncourse/kernel_provisioner.py).
c.KernelManager.client_class = "attncourse.kernel_provisioner.QuickReadyClient"

# A Python warning on stderr in a test cell would score it 0.  The hidden tests already keep
# the submission's warnings out of their cells; this also drops ones raised by visible checks.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"(?m)^\S.*:\d+: \w*Warning: "

# Feedback pages in the student's language: nbgrader's own feedback template with its labels translated for
# the Chinese edition's notebooks (tools/templates/feedback_attncourse).
import nbgrader  # noqa: E402

c.HTMLExporter.template_name = "feedback_attncourse"
c.HTMLExporter.extra_template_basedirs = [
    os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader", "templates"),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools", "templates")]

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# LMS downloads (make collect-zip): files named <student>_<notebook>.ipynb inside
# downloaded/<chapter>/archive/*.zip.  Adapt the pattern to your LMS's naming.
c.ZipCollectApp.archive_directory = "archive"
c.FileNameCollectorPlugin.named_regexp = r".*/(?P<student_id>[^_/]+)_(?P<file_id>[^/]+\.ipynb)$"
