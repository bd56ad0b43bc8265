"""What a statement may contain: expression classes, functions, bare keywords.

An allowlist, not a blocklist: a class or function that is not named here is
refused, so a new sqlglot construct (or a MySQL function nobody reviewed)
cannot slip through. sqlglot is pinned exactly (pyproject) because these
classes are its parse of MySQL.
"""

from __future__ import annotations

import re
from typing import Final

from sqlglot import exp

# The shape of a read-only query.
STRUCTURE: Final[frozenset[type[exp.Expression]]] = frozenset(
    {
        exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Subquery,
        exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered,
        exp.Limit, exp.Offset, exp.With, exp.CTE, exp.TableAlias, exp.Table,
        exp.Column, exp.Identifier, exp.Star, exp.Alias, exp.Distinct,
        exp.Window, exp.WindowSpec,
        # literals
        exp.Literal, exp.Null, exp.Boolean, exp.HexString, exp.BitString, exp.National,
        exp.Introducer, exp.DataType, exp.DataTypeParam, exp.Interval, exp.Var, exp.Tuple,
        # operators
        exp.Paren, exp.Neg, exp.Not, exp.And, exp.Or, exp.Xor,
        exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
        exp.Is, exp.In, exp.Between, exp.Like, exp.Escape, exp.Exists, exp.All, exp.Any,
        exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod,
        exp.BitwiseAnd, exp.BitwiseOr, exp.BitwiseXor, exp.BitwiseNot,
        exp.BitwiseLeftShift, exp.BitwiseRightShift,
        exp.Case, exp.If, exp.Cast, exp.Collate,
        exp.JSONPath, exp.JSONPathRoot, exp.JSONPathKey, exp.JSONPathSubscript,
        exp.JSONPathWildcard,
    }
)  # fmt: skip

# Pure functions over values: aggregates, windows, strings, numbers, dates, JSON reads.
FUNCTIONS: Final[frozenset[type[exp.Expression]]] = frozenset(
    {
        # aggregates
        exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.GroupConcat,
        exp.StddevPop, exp.StddevSamp, exp.VariancePop, exp.Variance,
        exp.BitwiseAndAgg, exp.BitwiseOrAgg, exp.BitwiseXorAgg,
        # windows
        exp.RowNumber, exp.Rank, exp.DenseRank, exp.Ntile, exp.Lag, exp.Lead,
        exp.FirstValue, exp.LastValue, exp.NthValue, exp.PercentRank, exp.CumeDist,
        # conditionals
        exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least,
        # numbers
        exp.Abs, exp.Ceil, exp.Floor, exp.Round, exp.Trunc, exp.Pow, exp.Sqrt, exp.Exp,
        exp.Ln, exp.Log, exp.Sign, exp.Pi, exp.Rand, exp.Degrees, exp.Radians,
        exp.Sin, exp.Cos, exp.Tan, exp.Atan, exp.Atan2, exp.Asin, exp.Acos, exp.Cot,
        exp.NumberToStr, exp.BitwiseCount,
        # strings
        exp.Concat, exp.ConcatWs, exp.Length, exp.Lower, exp.Upper, exp.Substring,
        exp.SubstringIndex, exp.Left, exp.Right, exp.Trim, exp.Replace, exp.Reverse,
        exp.StrPosition, exp.Pad, exp.Ascii, exp.Chr, exp.Hex, exp.Unhex, exp.MD5, exp.SHA,
        exp.SHA2, exp.Elt, exp.Soundex, exp.RegexpReplace, exp.RegexpSubstr,
        exp.RegexpInstr, exp.RegexpLike, exp.Stuff, exp.ToBase64, exp.FromBase64,
        exp.BitLength, exp.MatchAgainst,
        # dates and times
        exp.CurrentDate, exp.CurrentTimestamp, exp.CurrentTime, exp.UtcTimestamp,
        exp.Localtime, exp.Localtimestamp, exp.TsOrDsToDate, exp.TsOrDsToTimestamp,
        exp.Time, exp.Timestamp, exp.Year, exp.Month, exp.Day, exp.DayOfMonth,
        exp.DayOfWeek, exp.DayOfYear, exp.Week, exp.WeekOfYear, exp.Quarter, exp.Hour,
        exp.Minute, exp.Second, exp.Dayname, exp.LastDay, exp.DateAdd, exp.DateSub,
        exp.DateDiff, exp.TimestampDiff, exp.TimestampAdd, exp.TimeToStr, exp.StrToDate,
        exp.UnixToTime, exp.TimeFromParts, exp.Extract, exp.ConvertTimezone,
        # JSON (reading only)
        exp.JSONExtract, exp.JSONExtractScalar, exp.JSONKeys, exp.JSONObject,
        exp.JSONKeyValue, exp.JSONValue, exp.JSONType, exp.JSONObjectAgg,
    }
)  # fmt: skip

# Functions sqlglot has no class for (exp.Anonymous), by upper-case name.
ANONYMOUS_FUNCTIONS: Final = frozenset(
    {
        "NOW", "WEEKDAY", "YEARWEEK", "MICROSECOND", "ADDDATE", "SUBDATE", "ADDTIME",
        "SUBTIME", "TIMEDIFF", "TIME_FORMAT", "UNIX_TIMESTAMP", "FROM_DAYS", "TO_DAYS",
        "TO_SECONDS", "MAKEDATE", "PERIOD_ADD", "PERIOD_DIFF", "SEC_TO_TIME", "TIME_TO_SEC",
        "CONV", "CRC32", "ORD", "FIELD", "FIND_IN_SET", "STRCMP", "BIN", "OCT", "MID",
        "OCTET_LENGTH", "INET_ATON", "INET_NTOA", "QUOTE", "JSON_UNQUOTE", "JSON_LENGTH",
        "JSON_CONTAINS", "JSON_ARRAY", "JSON_VALID", "JSON_SEARCH", "JSON_ARRAYAGG",
        "JSON_DEPTH", "JSON_CONTAINS_PATH", "DATE_FORMAT", "LOG10", "LOG2", "TRUNCATE",
        "WEEKOFYEAR", "DAYOFWEEK", "MONTHNAME", "CHAR_LENGTH", "LCASE", "UCASE", "LOCATE",
        "INSTR", "POSITION", "SPLIT_PART", "FORMAT", "ISNULL", "IFNULL", "DATE", "TIME",
    }
)  # fmt: skip

# Never allowed, named so a rejection says why rather than "unknown function".
DANGEROUS_FUNCTIONS: Final = frozenset(
    {
        "SLEEP", "BENCHMARK", "LOAD_FILE", "GET_LOCK", "RELEASE_LOCK", "RELEASE_ALL_LOCKS",
        "IS_FREE_LOCK", "IS_USED_LOCK", "MASTER_POS_WAIT", "SOURCE_POS_WAIT",
        "MASTER_GTID_WAIT", "WAIT_FOR_EXECUTED_GTID_SET", "WAIT_UNTIL_SQL_THREAD_AFTER_GTIDS",
        "NAME_CONST", "EXTRACTVALUE", "UPDATEXML", "SYS_EVAL", "SYS_EXEC", "NEXTVAL",
        "SETVAL", "LASTVAL", "USER", "CURRENT_USER", "SESSION_USER", "SYSTEM_USER",
        "DATABASE", "SCHEMA", "VERSION", "CONNECTION_ID", "LAST_INSERT_ID", "ROW_COUNT",
        "FOUND_ROWS", "PASSWORD", "REPEAT", "SPACE", "UUID", "UUID_SHORT", "SYSDATE",
    }
)  # fmt: skip

# Bare keywords sqlglot keeps as `exp.Var`: allowed only where MySQL expects one.
_UNIT = re.compile(
    r"^(SQL_TSI_)?(MICROSECOND|SECOND|MINUTE|HOUR|DAY|WEEK|MONTH|QUARTER|YEAR|"
    r"SECOND_MICROSECOND|MINUTE_MICROSECOND|MINUTE_SECOND|HOUR_MICROSECOND|HOUR_SECOND|"
    r"HOUR_MINUTE|DAY_MICROSECOND|DAY_SECOND|DAY_MINUTE|DAY_HOUR|YEAR_MONTH)$",
    re.IGNORECASE,
)
_CHARSET = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_UNIT_PARENTS: Final = (
    exp.Interval, exp.DateAdd, exp.DateSub, exp.TimestampDiff, exp.TimestampAdd,
    exp.DateDiff, exp.Extract,
)  # fmt: skip
_CHARSET_PARENTS: Final = (exp.Collate, exp.DataType, exp.Chr)


def var_allowed(node: exp.Var) -> bool:
    """A bare keyword is a date unit, a charset or a collation, in its one place."""
    parent, name = node.parent, node.name
    if isinstance(parent, _UNIT_PARENTS) and node.arg_key in ("unit", "this"):
        return bool(_UNIT.match(name))
    if isinstance(parent, _CHARSET_PARENTS) and node.arg_key in ("expression", "kind", "charset"):
        return bool(_CHARSET.match(name))
    return False


def function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).upper()
    return node.sql_name()
