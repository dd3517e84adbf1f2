"""What the tests share and are not tests themselves: tiny models (`models`), a test drafter
(`drafter`), decoding references and checks (`decoding`), scripts run as a user runs them
(`scripts`, forked by `script_runner`), the CPU kernels' builds (`kernels`), what the suite
needs installed (`requirements`), and the programs the notebook and mesh tests run
(`notebook_runner`, `mesh_training`)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository."""
