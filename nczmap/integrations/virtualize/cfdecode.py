"""CF mask-and-scale decoding exactly as xarray does it, for variables whose packing differs between files.

When the files joined into one virtual dataset encode a variable differently (``scale_factor`` 1.0 in one
file and 0.5 in the next, another ``_FillValue``, a ``missing_value``, ``_Unsigned``), the joined variable
cannot keep one file's packing: it is stored *decoded*, as floats with ``_FillValue`` NaN and no packing
attributes. The decoded numbers must be those ``xr.open_mfdataset(files, engine="netcdf4")`` gives, which
decodes every file with its own attributes and then concatenates. This module reproduces xarray's
``decode_cf_variable(..., mask_and_scale=True, decode_times=False, decode_timedelta=False)`` bit for bit
with numpy alone, by performing the very numpy operations of xarray's coders in the same order and with
the same operand types:

- ``xarray.coding.variables._check_fill_values``: ``missing_value`` then ``_FillValue`` are collected into
  one set of encoded fill values (NaN ones left out; an integer variable whose attribute holds only NaN
  loses that attribute). When ``_FillValue`` and ``missing_value`` differ, *every* value of either is
  masked (xarray warns "multiple fill values", and decodes all of them to NaN).
- ``CFMaskCoder.decode`` and ``_convert_unsigned_fill_value``: ``_Unsigned = "true"`` on signed integers
  (``"false"`` on unsigned ones) reinterprets the data and the raw ``_FillValue``; on floats it is ignored.
  Masking converts to ``_choose_float_dtype(dtype, attrs)`` when ``scale_factor``/``add_offset`` is present,
  otherwise to ``xarray.core.dtypes.maybe_promote(dtype)`` (floats kept, integers of at most 2 bytes to
  float32, larger ones to float64), then ``data == fv`` for every fill value is set to NaN.
- ``CFScaleOffsetCoder.decode`` and ``_scale_offset_decoding``: ``data.astype(dtype)``, ``*= scale_factor``,
  ``+= add_offset``, where ``dtype`` is the masked data's dtype when a ``_FillValue``/``missing_value`` was
  kept, otherwise ``_choose_float_dtype`` — whose rules (``np.dtype(type(scale_factor))``: an integer
  ``scale_factor`` alone gives integer results; ``add_offset`` of another type gives float64; int32 data
  with float32 scale *and* offset gives float64) are copied exactly.
- ``EndianCoder`` (non-native byte order becomes native) and ``BooleanCoder`` (attribute ``dtype = "bool"``).

Attribute values are taken as netCDF4-python hands them to xarray: a 1-element array is its numpy scalar
(netCDF4-python returns ``value_arr[0]``), so that the numpy type promotion of ``data *= scale_factor`` is
the one xarray applied to the file. Anything xarray refuses or cannot decode (text or n-element
``scale_factor``, character/string data with packing, an integer ``scale_factor`` with a fill value,
a vector ``_FillValue`` with ``_Unsigned``...) is a :class:`~nczmap.errors.FormatError` naming the variable
and the attribute. Text ``_FillValue``/``missing_value`` on numeric data — xarray silently masks nothing
there — is refused too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from nczmap.errors import FormatError

__all__ = ["PACKING", "decode", "decoded_dtype", "joined_dtype", "stored_attributes"]

#: attributes whose difference between files changes the meaning of the stored numbers
PACKING = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned")

_NUMERIC_PACKING = ("scale_factor", "add_offset", "_FillValue", "missing_value")
_SCALING = ("scale_factor", "add_offset")


def decoded_dtype(dtype: np.dtype, attrs: Mapping[str, object], where: str = "variable") -> np.dtype:
    """The dtype xarray's ``decode_cf_variable`` (mask and scale) gives data of ``dtype`` with ``attrs``.

    No decoding, no change: an integer variable without ``_FillValue``, ``missing_value``, ``scale_factor``
    or ``add_offset`` stays integer. Raises :class:`FormatError` (naming ``where``) exactly when
    :func:`decode` would: decoding an empty array takes the same dtype decisions as decoding real data.
    """
    return decode(np.empty((0,), dtype=np.dtype(dtype)), attrs, where).dtype


def decode(raw: np.ndarray, attrs: Mapping[str, object], where: str) -> np.ndarray:
    """The values (and dtype) xarray's CF decoding gives the stored values ``raw`` with attributes ``attrs``.

    Equal to ``xarray.conventions.decode_cf_variable(name, xr.Variable(dims, raw, attrs), mask_and_scale=True,
    decode_times=False, decode_timedelta=False).values``, with ``attrs`` as netCDF4-python presents them.
    ``raw`` is never modified, but is returned itself when there is nothing to decode. Non-numeric data
    without any packing attribute is returned unchanged; with one it is refused. Errors are
    :class:`FormatError` naming ``where`` and the attribute.
    """
    data = np.asarray(raw)
    packing = _packing(attrs, where)
    if data.dtype.kind not in "iuf":
        if packing:
            names = ", ".join(repr(name) for name in packing)
            raise FormatError(
                f"{where}: {data.dtype} data with {names} cannot be mask-and-scale decoded "
                "(only integer and floating-point data can)"
            )
        return data
    _check_known_refusals(data.dtype, packing, where)
    try:
        with np.errstate(all="ignore"):  # casts of NaN to integers, wrapping multiplications: as xarray
            raw_fill, encoded = _fill_values(data.dtype, packing)
            data = _mask(data, packing, raw_fill, encoded)
            data = _scale(data, packing, kept_fill=bool(raw_fill))
            if not data.dtype.isnative:  # xarray's EndianCoder / NativeEndiannessArray
                data = data.astype(np.dtype(data.dtype.kind + str(data.dtype.itemsize)))
            if _text(attrs.get("dtype")) == "bool":  # xarray's BooleanCoder
                data = data.astype(bool)
    except (TypeError, ValueError, ArithmeticError, LookupError) as exc:
        names = ", ".join(repr(name) for name in packing)
        raise FormatError(f"{where}: cannot decode {np.asarray(raw).dtype} data with {names}: {exc}") from exc
    return data


def joined_dtype(dtypes: Sequence[np.dtype]) -> np.dtype:
    """The dtype of concatenating parts of ``dtypes``, promoted as xarray's concatenation does.

    ``xarray.core.dtypes.result_type``: numbers (or booleans) with strings, and bytes with str, give
    ``object``; otherwise numpy's promotion (float32 + float64 -> float64, int16 + float32 -> float32,
    int64 + uint64 -> float64).
    """
    found = [np.dtype(dtype) for dtype in dtypes]
    if not found:
        raise ValueError("joined_dtype needs at least one dtype")
    kinds = {dtype.kind for dtype in found}
    character = kinds & {"S", "U"}
    if (character and kinds & {"b", "i", "u", "f", "c"}) or character == {"S", "U"}:
        return np.dtype(object)
    return np.result_type(*found)


def stored_attributes(attrs: Mapping[str, object], dtype: np.dtype) -> dict[str, object]:
    """The attributes to store with decoded values of ``dtype``.

    ``attrs`` without ``scale_factor``, ``add_offset``, ``missing_value`` and ``_Unsigned``; ``_FillValue``
    is a NaN of ``dtype`` when that dtype can hold masked values (floating point) and absent otherwise,
    so that xarray reading the stored variable masks nothing more and scales nothing: it gives back exactly
    the decoded values. Every other attribute (``units``, ``long_name``, ``valid_range``...) is kept as given.
    """
    dtype = np.dtype(dtype)
    stored = {name: value for name, value in attrs.items() if name not in PACKING}
    if dtype.kind == "f":
        stored["_FillValue"] = dtype.type(np.nan)
    return stored


# -- attributes as xarray sees them ---------------------------------------------------------------------


def _packing(attrs: Mapping[str, object], where: str) -> dict[str, object]:
    """The packing attributes present, each as netCDF4-python hands it to xarray, or FormatError."""
    packing: dict[str, object] = {}
    for name in _NUMERIC_PACKING:
        if name in attrs:
            packing[name] = _number(attrs[name], name, where)
    if "_Unsigned" in attrs:
        unsigned = _text(attrs["_Unsigned"])
        if unsigned is None:
            raise FormatError(f"{where}: attribute '_Unsigned' must be text, not {attrs['_Unsigned']!r}")
        packing["_Unsigned"] = unsigned
    return packing


def _text(value: object) -> str | None:
    return str(value) if isinstance(value, str) else None


def _number(value: object, name: str, where: str) -> object:
    """A numeric attribute value: a Python or numpy number, or a 1-D numpy array of more than one."""
    if isinstance(value, str | bytes):
        raise FormatError(f"{where}: attribute {name!r} is text ({value!r}), not a number")
    if isinstance(value, bool | np.bool_) or value is None:
        raise FormatError(f"{where}: attribute {name!r} must be a number, not {value!r}")
    if isinstance(value, int | float) and not isinstance(value, np.generic):
        return value  # Python numbers as xarray sees them (np.dtype(type(value)): int64, float64)
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":
        raise FormatError(f"{where}: attribute {name!r} must be a number, not {value!r}")
    if array.size == 1:
        return array.reshape(-1)[0]  # a numpy scalar, as netCDF4-python returns a 1-element attribute
    if name in _SCALING:
        raise FormatError(f"{where}: attribute {name!r} must be one number, not {array.size}: {value!r}")
    return array.reshape(-1)


def _isnull(value: object) -> bool:
    """``pandas.isnull`` of one element of a numeric attribute."""
    return isinstance(value, float | np.floating) and math.isnan(value)


def _check_known_refusals(dtype: np.dtype, packing: Mapping[str, object], where: str) -> None:
    """The errors xarray would raise, with a message naming the attribute (others are caught generically)."""
    unsigned = packing.get("_Unsigned")
    fill = packing.get("_FillValue")
    reinterpreted = _unsigned_dtype(dtype, unsigned) != dtype
    if reinterpreted and isinstance(fill, np.ndarray) and not all(_isnull(fv) for fv in fill):
        raise FormatError(
            f"{where}: attribute '_FillValue' has {fill.size} values, which '_Unsigned' "
            f"= {unsigned!r} cannot reinterpret (xarray needs one)"
        )
    if any(name in packing for name in _SCALING):
        float_dtype = _choose_float_dtype(_unsigned_dtype(dtype, unsigned), packing)
        if float_dtype.kind != "f" and _fill_values(dtype, packing)[1]:
            scaling = " and ".join(repr(name) for name in _SCALING if name in packing)
            raise FormatError(
                f"{where}: {scaling} of type {float_dtype} give integer values, which cannot hold the "
                "masked values of '_FillValue'/'missing_value'"
            )


def _unsigned_dtype(dtype: np.dtype, unsigned: object) -> np.dtype:
    if dtype.kind == "i" and unsigned == "true":
        return np.dtype(f"u{dtype.itemsize}")
    if dtype.kind == "u" and unsigned == "false":
        return np.dtype(f"i{dtype.itemsize}")
    return dtype


# -- xarray's coders, operation for operation --------------------------------------------------------------


def _fill_values(dtype: np.dtype, packing: Mapping[str, object]) -> tuple[dict[str, object], set]:
    """``xarray.coding.variables._check_fill_values``: the raw fill attributes kept, and the fill values."""
    raw_fill = {name: packing[name] for name in ("missing_value", "_FillValue") if name in packing}
    encoded: set = set()
    for name in list(raw_fill):
        kfill = {fv for fv in np.ravel(raw_fill[name]) if not _isnull(fv)}
        if not kfill and dtype.kind in "iu":
            del raw_fill[name]  # xarray: "non-conforming ... dropping entirely"
        else:
            encoded |= kfill
    return raw_fill, encoded


def _mask(
    data: np.ndarray, packing: Mapping[str, object], raw_fill: dict[str, object], encoded: set
) -> np.ndarray:
    """``CFMaskCoder.decode``: ``_Unsigned`` reinterpretation, then fill values to NaN."""
    if "_Unsigned" not in packing and not raw_fill:
        return data
    unsigned = packing.get("_Unsigned")
    raw_fill_value = raw_fill.get("_FillValue")
    if data.dtype.kind == "i" and unsigned == "true":  # _convert_unsigned_fill_value
        unsigned_dtype = np.dtype(f"u{data.dtype.itemsize}")
        if raw_fill_value is not None:
            new_fill = np.array(raw_fill_value, dtype=data.dtype)
            encoded.remove(raw_fill_value)
            encoded.add(new_fill.view(unsigned_dtype).item())
        data = np.asarray(data, dtype=unsigned_dtype)
    elif data.dtype.kind == "u" and unsigned == "false":
        signed_dtype = np.dtype(f"i{data.dtype.itemsize}")
        data = np.asarray(data, dtype=signed_dtype)
        if raw_fill_value is not None:
            signed_fill = signed_dtype.type(raw_fill_value)
            encoded.remove(raw_fill_value)
            encoded.add(signed_fill)
    if not encoded:
        return data
    if any(name in packing for name in _SCALING):
        dtype = _choose_float_dtype(data.dtype, packing)
        decoded_fill_value: object = np.nan
    else:
        dtype, decoded_fill_value = _maybe_promote(data.dtype)
    # _apply_mask
    data = np.array(data, dtype=dtype, copy=True)
    condition: object = False
    for fv in encoded:
        condition |= data == fv
    data[condition] = decoded_fill_value
    return data


def _scale(data: np.ndarray, packing: Mapping[str, object], kept_fill: bool) -> np.ndarray:
    """``CFScaleOffsetCoder.decode`` and ``_scale_offset_decoding``.

    ``kept_fill``: CFMaskCoder moved a ``_FillValue``/``missing_value`` into the encoding (it drops all-NaN
    ones of integer variables); then the masked data's dtype is kept rather than chosen again.
    """
    if not any(name in packing for name in _SCALING):
        return data
    scale_factor = packing.get("scale_factor")
    add_offset = packing.get("add_offset")
    dtype = data.dtype if kept_fill else _choose_float_dtype(data.dtype, packing)
    data = data.astype(dtype=dtype, copy=True)
    if scale_factor is not None:
        data *= scale_factor
    if add_offset is not None:
        data += add_offset
    return data


def _maybe_promote(dtype: np.dtype) -> tuple[np.dtype, object]:
    """``xarray.core.dtypes.maybe_promote`` for integer and floating-point dtypes."""
    promoted = dtype if dtype.kind == "f" else np.dtype(np.float32 if dtype.itemsize <= 2 else np.float64)
    return promoted, promoted.type(np.nan)


def _choose_float_dtype(dtype: np.dtype, mapping: Mapping[str, object]) -> np.dtype:
    """``xarray.coding.variables._choose_float_dtype``, type for type (it may well not be a float)."""
    scale_factor = mapping.get("scale_factor")
    add_offset = mapping.get("add_offset")
    if scale_factor is not None or add_offset is not None:
        scale_type = np.dtype(type(scale_factor)) if scale_factor is not None else None
        offset_type = np.dtype(type(add_offset)) if add_offset is not None else None
        if (
            add_offset is not None
            and scale_factor is not None
            and offset_type == scale_type
            and scale_type in (np.float32, np.float64)
        ):
            if dtype.itemsize == 4 and dtype.kind in "iu":
                return np.dtype(np.float64)
            return np.dtype(scale_type)
        if add_offset is not None:
            return np.dtype(np.float64)
        return np.dtype(scale_type)
    if dtype.itemsize <= 4 and dtype.kind == "f":
        return np.dtype(np.float32)
    if dtype.itemsize <= 2 and dtype.kind in "iu":
        return np.dtype(np.float32)
    return np.dtype(np.float64)
