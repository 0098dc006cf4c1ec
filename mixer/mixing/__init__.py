"""Online data mixing: algorithms that turn per-source training losses into new weights.

Torch-free. The loader (`mixer.runtime.online_mixing`) adds up the losses a trainer reports
with `loader.report_loss`, combines them over ranks at each update point and asks the
recipe's algorithm for the weights; this package holds the algorithms and their registry:

    protocol.py   the `Algorithm` protocol, `register_algorithm`, `make_algorithm`
    odm.py        ODM (Albalak et al., 2023): EXP3 with the training loss as reward
    ado.py        ADO (Jiang et al., 2024): per-source power laws, weights from their slopes
    power_law.py  the deterministic fit of L(n) = ε + β·n^(-α) that ADO uses
"""

from mixer.mixing import ado, odm  # noqa: F401  (register the built-in algorithms)
from mixer.mixing.protocol import (
    ALGORITHMS,
    Algorithm,
    AlgorithmSpec,
    make_algorithm,
    register_algorithm,
)

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmSpec", "make_algorithm", "register_algorithm"]
