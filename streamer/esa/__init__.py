"""Encode–Shuffle–Analyze: the shuffle model as three separate roles over Kafka topics.

Bittau et al. 2017 ("Prochlo", SOSP 2017) §3: encoders on the users' side, a shuffler that strips
metadata, thresholds and permutes, and an analyzer that sees only shuffled batches of messages
encrypted to it. Here, for the ``shuffle-gaussian`` learner (Liew & Takahashi 2022 §5.2):

- :mod:`panpriv.streamer.esa.client`: the user's encoder — reads the public model of the round, sends one
  fixed-size message (clipped gradient + Gaussian noise) sealed to the analyzer's key and then to
  the shuffler's (onion sealing, :mod:`panpriv.streamer.esa.wire`). It imports only ``protocols``,
  ``accounting``, numpy, PyNaCl, kafka-python and :mod:`panpriv.streamer.esa.wire` /
  :mod:`panpriv.streamer.esa.keys` / :mod:`panpriv.streamer.esa.model` /
  :mod:`panpriv.streamer.esa.families` (nothing of the service);
- :mod:`panpriv.streamer.esa.shuffler`: ``panpriv shuffle`` — removes its own layer of each message
  (it holds no key that opens a unit), thresholds, permutes and signs each batch
  (:mod:`panpriv.streamer.esa.batches`, which the analyzer checks before anything else);
- :mod:`panpriv.streamer.esa.analyzer`: ``panpriv analyze`` — decrypts, steps, publishes the next model
  (its service loop, state and charges to the budget store shared by every run:
  :mod:`panpriv.streamer.esa.analyze_service`);
- for ``shuffle-sgd`` and ``shuffle-acsa`` (Cheu et al. 2022 Algs 3 and 4), whose PVEC counts must reach the analyzer only
  as per-coordinate totals: :mod:`panpriv.streamer.esa.sum_client` (each user's count vector as m
  split-and-mix shares, each sealed: Ishai et al. 2006, :mod:`panpriv.protocols.secure_sum`), the same
  shuffler releasing units (``--shares``) and :mod:`panpriv.streamer.esa.sum_analyzer`;
- ``shuffle-gd`` (every user answers each round: :mod:`panpriv.streamer.esa.gd_client`,
  :mod:`panpriv.streamer.esa.gd_analyzer`) and ``checkin`` (:mod:`panpriv.streamer.esa.checkin_client`,
  :mod:`panpriv.streamer.esa.slot_shuffler`, :mod:`panpriv.streamer.esa.checkin_analyzer`);
- :mod:`panpriv.streamer.esa.families`: the one list of these learners and how each runs (analyzer,
  encoder, shuffler mode, reject reasons, state format);
- :mod:`panpriv.streamer.esa.metrics`: the Prometheus series of the shuffler and the analyzer;
- :mod:`panpriv.streamer.esa.keys`: ``panpriv keygen`` (the analyzer's and the shuffler's key pairs);
- :mod:`panpriv.streamer.esa.deployment`: the statements, who reads which topic
  (:func:`panpriv.streamer.esa.deployment.topic_access`, the table the deploy/ ACLs grant) and the
  deployment id (:func:`panpriv.streamer.esa.deployment.data_key`).

This package's ``__init__`` imports nothing, so the client's imports stay as listed.
"""
