"""Loading python models never hides other modules from a concurrent import.

The check runs in a fresh interpreter (this file run as a script): each load and release walks sys.modules, and
with a switch interval of 1 µs the two threads trade the GIL all the time, so the same 3000 loads cost with the
number of modules imported. The test session has imported torch, ONNX Runtime, tritonclient and the rest: 46-52 s
there, 3-7 s in a fresh interpreter (2.8 s with the 70 modules it needs, 7.0 s with 2,000)."""

import importlib.machinery
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOADS = 3000


def check(tmp_path: Path) -> None:
    """An import in another thread (the server reads ONNX models while python models load) walks sys.path
    while model.py is imported: the walk must not skip entries."""
    from modelsvc.backends.python._python_import import _ModelFile

    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    wanted = "tritonclient"
    assert importlib.machinery.PathFinder.find_spec(wanted) is not None
    stop = threading.Event()
    misses: list[int] = []

    def look() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            if importlib.machinery.PathFinder.find_spec(wanted) is None:
                misses.append(n)

    looker = threading.Thread(target=look)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often, so the walk and the import interleave
    looker.start()
    try:
        for _ in range(LOADS):
            _ModelFile(folder / "model.py", "m", 1).release()
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        looker.join()
    assert not misses, f"{len(misses)} lookups of '{wanted}' found nothing while python models loaded"
    assert str(folder) not in sys.path


def test_loading_python_models_never_hides_other_modules_from_a_concurrent_import(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, __file__, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=110
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{LOADS} loads, no miss" in run.stdout, run.stdout + run.stderr


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    check(Path(sys.argv[1]))
    print(f"{LOADS} loads, no miss")
