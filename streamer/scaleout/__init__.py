"""One pan-private AC-SA model on many processes over Kafka (issue 20).

- :mod:`streamer.scaleout.wire` — the gradient and model records on their topics;
- :mod:`streamer.scaleout.worker` — ``panpriv worker``: a consumer-group member that runs Cheu et
  al. 2022 Alg. 6 lines 4–9 per batch and publishes only noisy batch means;
- :mod:`streamer.scaleout.coordinator` — ``panpriv coordinate``: combines K means per step
  (synchronous versions, :mod:`protocols.pan_acsa_scaleout`) and publishes the model;
- :mod:`streamer.scaleout.metrics` — both roles' Prometheus series (``--metrics-port``);
- :mod:`streamer.scaleout.commands` — the command-line wiring.
"""
