"""Composition roots: where agents, a transport, the controller, the observer and the API are
put together into a running cluster (above every layer they assemble; docs/architecture.md,
"Layers").

* :mod:`miso.cluster.local`: ``LocalCluster``, the one-process emulated cluster (tests,
  benchmarks, ``miso demo --no-ray``) over the in-process transport.
* :mod:`miso.cluster.rayactors`: the agent and controller Ray actors (the controller's side of
  Ray is :class:`miso.transport.ray.RayTransport`).
* :mod:`miso.cluster.raystart`: starting, finding, checkpointing and stopping those actors in a
  running Ray; :mod:`miso.cluster.fakeactors`: fake agents as Ray actors (scale tests);
  :mod:`miso.cluster.rayletenv`: the raylet setting an agent actor refuses to start without.

Starting and stopping a Ray head itself is :mod:`miso.raycluster` (the facade the CLI uses).
Only the Ray modules use ray, and import it only when called.
"""
