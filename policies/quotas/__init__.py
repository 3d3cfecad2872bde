"""Tenant and key quotas (RPM, TPM, concurrency, daily and monthly spend) on a ``Store``.
See ``manager`` for the accounting contract and ``windows`` for the window choice."""

from policies.quotas.manager import Admission, QuotaManager

__all__ = ["Admission", "QuotaManager"]
