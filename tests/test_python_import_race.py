import importlib.machinery
import sys
import threading
from pathlib import Path

from modelsvc.backends._python_import import _ModelFile


def test_loading_python_models_never_hides_other_modules_from_a_concurrent_import(tmp_path: Path) -> None:
    """An import in another thread (the server reads ONNX models while python models load) walks sys.path
    while model.py is imported: the walk must not skip entries."""
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
        for _ in range(3000):
            _ModelFile(folder / "model.py", "m", 1).release()
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        looker.join()
    assert not misses, f"{len(misses)} lookups of '{wanted}' found nothing while python models loaded"
    assert str(folder) not in sys.path
