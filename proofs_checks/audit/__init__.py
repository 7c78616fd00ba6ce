"""``rattn audit``: a recorded training run (``torch_port.audit.record``) replayed through the
float64 reference, step by step. NumPy only: ``trace`` reads and checks the file; ``replay``
replays it against the rule of ``rules``, reading each record through ``elements`` and
``states``, within the rounding bounds of ``bounds``; ``verdicts`` gives each row its verdict;
``report`` writes the table and the plot."""
