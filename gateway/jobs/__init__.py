"""Batches at run time: the runner that claims items from the job store (``policies.jobs``)
and sends each through the gateway's own app (``runner``, ``inprocess``), the bookkeeping
between claims (``housekeeping``), the gateway's checks of input lines (``validate``), and
what the Files and Batch routes share (``api``). See docs/batches.md."""
