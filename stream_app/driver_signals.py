"""The Spark driver JVM's SIGTERM handler, set aside while the job runs so that its stop stays clean."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def jvm_ignores_sigterm(spark: Any) -> Callable[[], None]:
    """Let the Python side alone handle SIGTERM while the job runs; returns how to undo it.

    Supervisors stop a process by signalling its whole group (the demo, systemd's default
    ``KillMode=control-group``, a shell's job control), and the group holds Spark's driver JVM too:
    PySpark starts it as a child, ignoring only SIGINT there (``pyspark.java_gateway``). On SIGTERM
    the JVM runs its shutdown hooks, and Spark's stops the SparkContext while the job's clean stop
    (last micro-batch, snapshot merge and checkpoint) still needs it: the stop then fails with
    ``Cannot call methods on a stopped SparkContext`` or a ``NullPointerException`` in
    ``SparkPlan.session`` (a plan built after the stop finds no usable active session). So the JVM
    ignores SIGTERM, as it ignores SIGINT, until :meth:`StreamJob.stop` is done; it still exits with
    the Python process (the gateway exits when its stdin closes), and SIGKILL still ends it.

    Returns:
        A function that restores the JVM's previous SIGTERM handler (a no-op when none was replaced,
        e.g. a JVM started with ``-Xrs``: a warning says so).
    """
    try:
        jvm = spark.sparkContext._jvm
        term = jvm.sun.misc.Signal("TERM")
        previous = jvm.sun.misc.Signal.handle(term, jvm.sun.misc.SignalHandler.SIG_IGN)
    except Exception as exc:  # the job still runs; only a group-wide SIGTERM is unclean then
        log.warning(
            "the Spark driver JVM keeps its SIGTERM handler (%s): a SIGTERM to the process group "
            "stops the SparkContext before the job's clean stop",
            exc,
        )
        return lambda: None

    def restore() -> None:
        try:
            jvm.sun.misc.Signal.handle(term, previous)
        except Exception as exc:  # the gateway may be gone: nothing to restore
            log.debug("the Spark driver JVM's SIGTERM handler was not restored: %s", exc)

    return restore
