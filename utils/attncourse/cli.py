"""The learner's command line: ``attncourse validate NOTEBOOK`` (also ``python -m attncourse validate NOTEBOOK``,
where no console script is on PATH), the same self-check as ``make validate NB=NOTEBOOK``, without make."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["validate"]:
        from .validate import main as validate
        return validate(argv[1:], prog="attncourse validate")
    if argv[:1] == ["--version"]:
        from . import __version__
        print(f"attncourse {__version__}")
        return 0
    from .i18n import translate
    asked = argv[:1] in (["-h"], ["--help"])
    print(translate("usage: attncourse validate NOTEBOOK (runs your notebook as the grader will and lists what passes)"),
          file=sys.stdout if asked else sys.stderr)
    return 0 if asked else 2


if __name__ == "__main__":
    sys.exit(main())
