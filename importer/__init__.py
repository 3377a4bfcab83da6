"""Part: importer. ``gpuprobe import nvidia-smi FILE…``: existing GPU logs become ``gpu`` points (docs/schema.md).

Reads the CSV of ``nvidia-smi --query-gpu=… --format=csv[,nounits]``, the output of
``nvidia-smi dmon`` and, with a column mapping, any other CSV of GPU readings; converts every value
to the schema's unit exactly, tags each point ``source=import`` and writes them through the v1 write
API of :mod:`gpuprobe.influx`. Modules:

- :mod:`.timeparse`: time zones, the timestamps of the logs, ``--freeze-after`` durations;
- :mod:`.formats`: the ``gpu`` fields and units, telling the formats apart, reading rows;
- :mod:`.run`: the import (frozen stretches, batches, the summary) and :class:`~.run.ImportSettings`;
- :mod:`.progress`: the progress line on stderr;
- :mod:`.cli`: the command.

Nothing is imported here, so ``gpuprobe --help`` stays light. Methods: docs/models.md, "Importing
existing nvidia-smi logs".
"""
