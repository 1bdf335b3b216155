"""Inference services: the model catalogue and latency model (``catalog``), one replica's
request queue (``replica``), request traces (``traces``) and the covering planner
(``planner``). Pure modules: no I/O beyond reading shipped data files."""
