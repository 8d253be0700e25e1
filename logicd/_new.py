"""``logicd new``: a complete service folder from one of the templates that ship with logicd.

    logicd new NAME [--template text-classifier|embedder|blank] [--no-input] [--force] [-o DIR] [-d KEY=VALUE]

The templates are a Copier template (``logicd/templates``: ``copier.yml`` holds the questions, one folder per
kind of service, files ending in ``.jinja`` are rendered with Jinja2). ``new`` checks NAME, answers ``template``,
``name`` and ``module`` itself and lets Copier ask the rest on a terminal; ``--no-input``, or a stdin that is not a
terminal, takes the defaults, and ``-d KEY=VALUE`` answers a question (``-d port=9000``).

NAME follows the rule of service.yaml's ``name`` (a DNS-1123 label) and starts with a letter, since the logic
module is NAME with '-' as '_'; a module that would shadow an importable one (``json``, ``numpy``, logicd's own
``logicd`` and ``modelsvc``) or a folder of the service (``tests``) is refused too, and so is one that would collide
with its neighbours when their tests run in one process: the logic module of a sibling service (the ``service:``
of a folder next to it with a service.yaml) or a module importable from the folder it goes into or from the root
of the logicd repository it is written in (``services``). A ``-d`` answer to a question that the chosen template
does not ask (``route`` of an embedder, ``labels`` of anything but a text classifier) is refused.

The service goes to ``DIR/NAME`` (DIR: the current folder; DIR must be a folder, or not be there yet). A folder that
is there already is refused, unless it is empty or ``--force`` is given: then the template's files are written over
it (files the template makes are replaced, and listed; anything else, a built model for one, is kept). The answers
are recorded in the service's ``.copier-answers.yml``.

Exit status: 0 written; 2 a NAME that breaks the rule, a folder in the way, a bad answer; 1 Copier failed.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import keyword
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import yaml

from ._config import NAME_RULE, is_service_name

__all__ = [
    "DEFAULT_TEMPLATE",
    "RULE",
    "TEMPLATES",
    "TEMPLATES_DIR",
    "NewError",
    "command",
    "module_name",
    "name_error",
    "new_service",
]

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
"""The Copier template: copier.yml and one folder per kind of service."""

TEMPLATES = {
    "text-classifier": "zero-shot classification of documents of any length (512-token windows)",
    "embedder": "OpenAI-compatible /v1/embeddings",
    "blank": "one route, one model call",
}
DEFAULT_TEMPLATE = "text-classifier"

RULE = f"NAME must be {NAME_RULE}, and start with a letter (the logic module is NAME with '-' as '_')"
"""What ``new`` says when it refuses a NAME."""

DOCKERFILE = Path("docker", "logic.Dockerfile")
"""What marks the root of the logicd repository, from which the images are built (deploy/build-args.env)."""

USAGE_ERROR = 2
RUN_ERROR = 1

_SERVICE_FOLDERS = frozenset(
    {"tests", "loadtest", "deploy", "model_repository", "tokenizer", "build_model", "conftest", "example"}
)
"""Module names that a generated folder uses itself."""

_FRAMEWORK = frozenset({"logicd", "modelsvc"})
"""logicd's own packages: a service module of that name shadows the framework, however logicd is installed."""


class NewError(Exception):
    """``new`` cannot write the service; the message says why (and the exit status is 2)."""


def module_name(name: str) -> str:
    """The logic module of service ``name``."""
    return name.replace("-", "_")


def name_error(name: str) -> str | None:
    """Why ``name`` cannot name a new service, stating the rule; ``None`` when it can."""
    if not is_service_name(name) or not name[0].isalpha():
        return f"{name!r} cannot name a service: {RULE}"
    module = module_name(name)
    why = None
    if keyword.iskeyword(module) or keyword.issoftkeyword(module):
        why = "is a Python keyword"
    elif module in _SERVICE_FOLDERS:
        why = "is the name of a file or folder the service holds"
    elif module in _FRAMEWORK:
        why = "would shadow logicd's own package of that name"
    elif module in sys.stdlib_module_names or module in sys.builtin_module_names:
        why = "would shadow the standard library's module of that name"
    elif _installed(module):
        why = "would shadow the installed module of that name"
    return None if why is None else f"{name!r} cannot name a service: its logic module {module!r} {why}"


def _installed(module: str) -> bool:
    """Whether ``import module`` finds a module or package (the current folder left out of sys.path).

    ``importlib.util.find_spec`` asks every finder of sys.meta_path, so editable installs (whose finders are not
    on sys.path) are seen too.
    """
    here = {"", ".", os.getcwd()}
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if p not in here]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a module in sys.modules without a spec, a finder that fails: not shadowed
        spec = None
    finally:
        sys.path[:] = saved
    return spec is not None and spec.origin is not None  # a namespace package (origin None) is just a folder


def _importable_from(module: str, folder: Path) -> bool:
    """Whether ``import module`` with ``folder`` on sys.path finds a module or a regular package there."""
    spec = importlib.machinery.PathFinder.find_spec(module, [str(folder)])
    return spec is not None and spec.origin is not None  # a folder without __init__.py never shadows a module


def _neighbour_error(name: str, target: Path) -> str | None:
    """Why service ``name``'s logic module would collide with what lies around ``target``; ``None`` when not.

    The tests of several services run in one process (pytest services/a services/b, from the repository's root)
    share sys.modules: a module imported for one is the module the other gets.
    """
    module = module_name(name)
    parent = target.parent
    here = target.resolve() if target.exists() else None
    siblings = sorted(parent.iterdir()) if parent.is_dir() else []
    for sibling in siblings:
        if not sibling.is_dir() or (here is not None and sibling.resolve() == here):
            continue
        config = sibling / "service.yaml"
        try:
            loaded = yaml.safe_load(config.read_text(encoding="utf-8")) if config.is_file() else None
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not a service.yaml this check can read: load_config will say what is wrong with it
        used = loaded.get("service") if isinstance(loaded, dict) else None
        if isinstance(used, str) and used.partition(":")[0].split(".")[0] == module:
            return (
                f"{name!r} cannot name a service here: its logic module {module!r} is the logic module of "
                f"{sibling} (service: {used}), and the two would collide when their tests run in one process"
            )
    root = _repository_root(target)
    for folder in dict.fromkeys(p for p in (parent, root) if p is not None):
        if folder.is_dir() and _importable_from(module, folder):
            return (
                f"{name!r} cannot name a service here: its logic module {module!r} would shadow the module of "
                f"that name in {folder}"
            )
    return None


def _output_error(output_dir: Path) -> str | None:
    """Why ``output_dir`` cannot hold the service (a file where it or a folder above it should be); ``None``."""
    for path in (output_dir, *output_dir.absolute().parents):
        if path.exists():
            return None if path.is_dir() else f"-o {output_dir}: {path} is a file, not a folder"
        if path.is_symlink():
            return f"-o {output_dir}: {path} is a broken symbolic link"
    return None


def new_service(
    name: str,
    *,
    template: str = DEFAULT_TEMPLATE,
    output_dir: Path = Path(),
    data: dict[str, str] | None = None,
    ask: bool = False,
    force: bool = False,
) -> Path:
    """Write service ``name`` from ``template`` into ``output_dir / name``; its folder.

    ``data`` answers questions (as text, as a terminal would); ``ask`` lets Copier prompt for the others, else
    their defaults are taken. Raises :class:`NewError` for a bad name, a folder in the way or a bad answer.
    """
    why = name_error(name)
    if why is not None:
        raise NewError(why)
    if template not in TEMPLATES:
        raise NewError(f"no template {template!r}; the templates: {', '.join(TEMPLATES)}")
    fixed = {"template": template, "name": name, "module": module_name(name)}
    _check_answers(data or {}, fixed)
    why = _output_error(output_dir)
    if why is not None:
        raise NewError(why)
    target = output_dir / name
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise NewError(f"{target} exists and is not a folder")
        if not force and any(target.iterdir()):
            raise NewError(
                f"{target} exists; --force writes the template's files over it "
                "(files the template makes are replaced, anything else is kept)"
            )
    why = _neighbour_error(name, target)
    if why is not None:
        raise NewError(why)

    try:
        import copier
    except ImportError:  # pragma: no cover - copier is a dependency of logicd
        raise NewError("logicd new needs copier: pip install copier") from None

    answers: dict[str, Any] = {**(data or {}), **fixed}
    root = _repository_root(target)
    if root is not None and "service_dir" not in answers:
        answers["service_dir"] = target.resolve().relative_to(root).as_posix()
    try:
        copier.run_copy(
            str(TEMPLATES_DIR),
            target,
            data=answers,
            defaults=not ask,
            overwrite=force,
            quiet=True,
        )
    except ValueError as exc:  # an answer its validator refused, or one of the wrong type
        raise NewError(str(exc)) from None
    return target


def command(args: argparse.Namespace) -> int:
    """``logicd new``, as the command line calls it: write the service, print what was written and what next."""
    ask = not args.no_input and sys.stdin.isatty() and sys.stdout.isatty()
    existing = _existing_files(args.output_dir / args.name) if args.force else set()
    try:
        folder = new_service(
            args.name,
            template=args.template,
            output_dir=args.output_dir,
            data=parse_data(args.data),
            ask=ask,
            force=args.force,
        )
    except NewError as exc:
        print(f"logicd new: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("logicd new: cancelled", file=sys.stderr)
        return RUN_ERROR
    except Exception as exc:  # Copier failed: show why, in one line
        print(f"logicd new: the template could not be written: {type(exc).__name__}: {exc}", file=sys.stderr)
        return RUN_ERROR
    made = set(template_files(args.template, module_name(args.name)))
    files = [path for path in generated_files(folder) if path in made or path not in existing]
    replaced = [path for path in files if path in existing]
    shown = _shown(folder)
    build = "the ONNX model and the tokenizer (about a minute)" if args.template != "blank" else "the ONNX model"
    lines = [
        f"logicd new: wrote the {args.template} service {args.name!r} in {shown} ({len(files)} files):",
        *(f"  {path}{'  (replaced)' if path in existing else ''}" for path in files),
        *(
            [f"--force: replaced {len(replaced)} existing files (marked above); anything else in the folder is kept"]
            if replaced
            else []
        ),
        "next:",
        f"  cd {shlex.quote(shown)}",
        f"  python build_model.py     # {build}",
        "  python -m pytest          # its tests, in-process and end to end",
        "  logicd up .               # the model service and the logic server; sends example.json",
        "  README.md says how to load-test it and deploy it",
    ]
    print("\n".join(lines))
    return 0


def _existing_files(folder: Path) -> set[Path]:
    """The files under ``folder`` before ``--force`` writes over it (none when it is not a folder)."""
    try:
        return set(generated_files(folder)) if folder.is_dir() else set()
    except OSError:
        return set()


def _shown(folder: Path) -> str:
    """``folder`` as the user would type it: relative to the current folder when it is below it."""
    try:
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder)


def _check_answers(data: dict[str, str], fixed: dict[str, str]) -> None:
    """Refuse ``-d`` answers to questions the template does not ask, or that the chosen kind of service skips (its
    files would use an answer that its logic does not), and whole numbers that are not numbers (Copier checks the
    rest with the questions' validators)."""
    questions = {
        key: spec
        for key, spec in yaml.safe_load((TEMPLATES_DIR / "copier.yml").read_text(encoding="utf-8")).items()
        if not key.startswith("_") and key not in fixed
    }
    template = fixed["template"]
    asked = [key for key, spec in questions.items() if not _skipped(spec, template)]
    for key, value in data.items():
        if key in fixed:
            raise NewError(f"-d {key}=...: {key} comes from NAME and --template, not from -d")
        if key not in questions:
            raise NewError(f"-d {key}=...: no such question; the questions: {', '.join(questions)}")
        if key not in asked:
            raise NewError(
                f"-d {key}=...: the {template} template does not ask {key} (its service would not use it); "
                f"its questions: {', '.join(asked)}"
            )
        if questions[key].get("type") == "int":
            try:
                int(value)
            except ValueError:
                raise NewError(f"-d {key}={value}: {key} is a whole number") from None


_FALSE = frozenset({"", "false", "no", "n", "off", "0", "none", "null", "~"})
"""What Copier reads as false in a rendered ``when:``."""


def _skipped(spec: Any, template: str) -> bool:
    """Whether the question ``spec`` of copier.yml is skipped for ``template`` by a ``when:`` that depends on it.

    A plain ``when: false`` is a question Copier never asks but that takes an answer (``service_dir``): not
    skipped.
    """
    when = spec.get("when", True) if isinstance(spec, dict) else True
    if not isinstance(when, str):
        return False
    environment = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined)
    try:
        rendered = environment.from_string(when).render(template=template)
    except jinja2.UndefinedError:  # it depends on other answers too: Copier decides
        return False
    return rendered.strip().lower() in _FALSE


def _repository_root(target: Path) -> Path | None:
    """The logicd repository that ``target`` lies in (the folder whose docker/ builds the images), if any."""
    for folder in target.resolve().parents:
        if (folder / DOCKERFILE).is_file():
            return folder
    return None


def template_files(template: str, module: str) -> list[Path]:
    """The files that ``template`` writes for logic module ``module``, relative to the service's folder, sorted."""
    source = TEMPLATES_DIR / template
    environment = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined)
    names = {"module": module, "_copier_conf": {"answers_file": ".copier-answers.yml"}}
    files = []
    for path in source.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            relative = environment.from_string(path.relative_to(source).as_posix()).render(names)
            files.append(Path(relative.removesuffix(".jinja")))
    return sorted(files)


def generated_files(folder: Path) -> list[Path]:
    """The files under ``folder``, sorted, for the summary ``new`` prints."""
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


def parse_data(pairs: Sequence[str]) -> dict[str, str]:
    """``-d KEY=VALUE`` flags as a mapping; a flag without '=' raises :class:`NewError`."""
    data: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise NewError(f"-d {pair}: expected KEY=VALUE")
        data[key] = value
    return data
