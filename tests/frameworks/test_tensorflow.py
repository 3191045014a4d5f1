"""TensorFlow/Keras on DDL: WMLCE's `import ddl` recipe under model.fit and a custom loop
with DistributedGradientTape, and Horovod Keras scripts (real 2-rank jobs, CPU TF)."""

from __future__ import annotations

import pytest
from conftest import WORKERS, mpirun, need, ok_lines

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def _tf() -> None:
    need("tensorflow")


@pytest.mark.parametrize("mode", ["fit", "tape"])
def test_import_ddl_matches_single_process(mode: str) -> None:
    proc = mpirun(2, WORKERS / "tf_keras.py", mode)
    assert ok_lines(proc, mode) == 2, proc.stdout


@pytest.mark.parametrize("module", ["horovod.tensorflow.keras", "horovod.keras"])
def test_horovod_keras_script(module: str) -> None:
    proc = mpirun(2, WORKERS / "hvd_keras.py", module)
    assert ok_lines(proc, "hvd_keras") == 2, proc.stdout
