"""Privacy accounting for every mechanism in panpriv.

Pure functions of scalars plus a ledger: no I/O and no arrays of records. Each module covers one
family of mechanisms and cites the paper (docs/references.md) and theorem it implements.
"""

from panpriv.accounting.errors import AccountingError, InvalidParameterError

__all__ = ["AccountingError", "InvalidParameterError"]
