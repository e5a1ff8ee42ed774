"""Sources: where records come from, resumable from a position.

One contract (after bytewax's sources): a source is *built from a resume position* (the next
unread position of every source key, as saved in a checkpoint), *yields micro-batches*
(:meth:`Source.poll`), and *reports the position of the next unread record*
(:attr:`Batch.ranges` of each batch, ending where the next batch begins).

A *source key* names an independent, ordered sequence of positions, and a record is identified by
``(key, position)`` in the privacy ledger:

================================  =================================  ================================
URL                               key                                position
================================  =================================  ================================
``kafka://h:p/topic[,t2]?group=g``  ``topic/partition``               Kafka offset
``file:PATH`` (a recording)       the recorded ``topic/partition``   the recorded Kafka offset
``file:PATH`` (JSONL, CSV)        ``file:<absolute path>``           line index (0-based)
``adult:train`` / ``adult:test``  ``adult:train`` / ``adult:test``   line index
``synthetic:n=…&dim=…&seed=…``    ``synthetic:seed=S,dim=D``          record index
================================  =================================  ================================

A batch's range for a key is ``[position before the batch, position after it)``: it includes any
position that holds no usable record (a blank line, a rejected message, an offset gap), so the
consumed positions of a key always form one contiguous interval. The ledger is charged with these
whole ranges — conservative (a rejected record is accounted as if used) and compact (one segment per
key however long the stream).

The modules: :mod:`~panpriv.streamer.sources.base` (the contract), :mod:`~panpriv.streamer.sources.local`
(files, recordings, the synthetic stream), :mod:`~panpriv.streamer.sources.kafka` and
:mod:`~panpriv.streamer.sources.confluent` (the two Kafka clients), :mod:`~panpriv.streamer.sources.open` (a URL → its
source) and :mod:`~panpriv.streamer.sources.identity` (data keys).
"""
