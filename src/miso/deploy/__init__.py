"""Running miso where GPU clusters already live: inside a Slurm allocation (:mod:`.slurm`,
:mod:`.slurmrun`), under systemd or Kubernetes, each node's Ray owned by :mod:`.node`.
See docs/deploy.md."""
