"""One pan-private AC-SA model on many processes over Kafka (issue 20).

- :mod:`panpriv.streamer.scaleout.wire` — the gradient and model records on their topics;
- :mod:`panpriv.streamer.scaleout.worker` — ``panpriv worker``: a consumer-group member that runs Cheu et
  al. 2022 Alg. 6 lines 4–9 per batch and publishes only noisy batch means;
- :mod:`panpriv.streamer.scaleout.coordinator` — ``panpriv coordinate``: combines K means per step
  (synchronous versions, :mod:`panpriv.protocols.pan_acsa_scaleout`) and publishes the model;
- :mod:`panpriv.streamer.scaleout.metrics` — both roles' Prometheus series (``--metrics-port``);
- :mod:`panpriv.streamer.commands.scaleout` — the command-line wiring.
"""
