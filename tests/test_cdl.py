"""Unit tests of the CDL printer (nczmap.cdl) against values derived from C printf semantics and from
ncdump's source (ncdump.c, dumplib.c, vardata.c, utils.c). Python's ``%`` formatting of ``%#.7g`` and
friends is C's printf, so the expected strings below are written out by hand from those rules."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import numpy as np
import pytest

from nczmap import cdl, cdl_text
from nczmap.cdl import NoSuchVariable, dimension_reference, dump_cdl
from nczmap.cdl_text import (
    ValueFormatter,
    escaped_name,
    format_attribute_values,
    format_double_att,
    format_float_att,
    quote_att_text,
    quote_char_data,
    quote_string_data,
    tztrim,
)
from nczmap.format.codecs import CodecChain
from nczmap.format.dialects import Dialect
from nczmap.format.model import Attribute, Dimension, Group
from nczmap.format.types import BY_NAME, ParsedDtype


# ============================================================================================= numbers
@pytest.mark.parametrize(
    ("text", "trimmed"),
    [
        ("1.500000", "1.5"),
        ("2.000000", "2."),
        ("100000.", "100000."),  # nothing after the point: left alone
        ("1.000000e+30", "1.e+30"),
        ("1.500000e-10f", "1.5e-10f"),
        ("-0.1000000000000000", "-0.1"),
        ("0.000000", "0."),
        ("123", "123"),  # no point, no zeros to trim
        ("120", "12"),  # ncdump trims any trailing zeros of the digit run (never happens with %#g)
    ],
)
def test_tztrim(text: str, trimmed: str) -> None:
    assert tztrim(text) == trimmed


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.5, "1.5f"),
        (2.0, "2.f"),
        (0.1, "0.1f"),
        (1e30, "1.e+30f"),
        (-1.5, "-1.5f"),
        (3.1415927, "3.141593f"),
        (0.0, "0.f"),
        (-0.0, "-0.f"),
        (123456789.0, "1.234568e+08f"),
        (1e-45, "1.401298e-45f"),
        (9.969209968386869e36, "9.96921e+36f"),
        (math.nan, "NaNf"),
        (math.inf, "Infinityf"),
        (-math.inf, "-Infinityf"),
    ],
)
def test_float_attribute_values(value: float, text: str) -> None:
    assert format_float_att(value) == text
    if math.isfinite(value):  # the same as C: snprintf(gps, ..., "%#.7gf", ff) then tztrim
        assert text == tztrim("%#.7gf" % float(np.float32(value)))  # noqa: UP031


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1."),
        (0.1, "0.1"),
        (-2.5, "-2.5"),
        (100.0, "100."),
        (999999986991104.0, "999999986991104."),
        (1e300, "1.e+300"),
        (3.14159265358979, "3.14159265358979"),
        (1 / 3, "0.333333333333333"),
        (5e-324, "4.94065645841247e-324"),
        (-0.0, "-0."),
        (math.nan, "NaN"),
        (-math.inf, "-Infinity"),
    ],
)
def test_double_attribute_values(value: float, text: str) -> None:
    assert format_double_att(value) == text


@pytest.mark.parametrize(
    ("nctype", "value", "text"),
    [
        ("byte", np.array([-128, 0, 127], "i1"), b"-128b, 0b, 127b"),
        ("ubyte", np.array([0, 255], "u1"), b"0UB, 255UB"),
        ("short", np.array([-32768], "i2"), b"-32768s"),
        ("ushort", np.array([65535], "u2"), b"65535US"),
        ("int", np.array([-1, 2147483647], "i4"), b"-1, 2147483647"),
        ("uint", np.array([4294967295], "u4"), b"4294967295U"),
        ("int64", np.array([-(2**63)], "i8"), b"-9223372036854775808LL"),
        ("uint64", np.array([2**64 - 1], "u8"), b"18446744073709551615ULL"),
        ("float", np.array([1.5, np.nan], "f4"), b"1.5f, NaNf"),
        ("double", np.array([0.5, -np.inf]), b"0.5, -Infinity"),
        ("char", "m/s", b'"m/s"'),
        ("char", "", b'""'),
        ("string", ["a", 'b"c'], b'"a", "b\\"c"'),
        ("string", [], b'""'),  # zero-length attributes print as ""
        ("int", np.array([], "i4"), b'""'),
    ],
)
def test_attribute_values(nctype: str, value: object, text: bytes) -> None:
    assert format_attribute_values(nctype, value) == text


def test_float_data_format_is_printf_g() -> None:
    formatter = ValueFormatter("float", None)
    values = np.array([1.5, 0.1, 1e30, 123456.79, -0.0, np.nan, -np.inf], dtype=np.float32)
    assert formatter(values) == [b"1.5", b"0.1", b"1e+30", b"123456.8", b"-0", b"NaNf", b"-Infinityf"]
    doubles = ValueFormatter("double", None)(np.array([0.1, 1 / 3, 1e-300, np.inf]))
    assert doubles == [b"0.1", b"0.333333333333333", b"1e-300", b"Infinity"]


# ================================================================================================ text
def test_attribute_text_escapes() -> None:
    assert quote_att_text(b"a\"b\\c'd") == b'"a\\"b\\\\c\\\'d"'
    assert quote_att_text(b"\b\f\n\r\t\v") == b'"\\b\\f\\n\\r\\t\\v"'
    assert quote_att_text(b"x\x01y\x7f") == b'"x\\001y\\177"'  # iscntrl: octal
    assert quote_att_text("é☃".encode()) == '"é☃"'.encode()  # UTF-8 bytes are printed as they are
    assert quote_att_text(b"abc\x00\x00") == b'"abc"'  # trailing NULs dropped
    assert quote_att_text(b"a\x00b") == b'"a\\000b"'


def test_char_data_escapes() -> None:
    assert quote_char_data(b"ab\x00\x00") == b'"ab"'
    assert quote_char_data("é".encode()) == b'"\\303\\251"'  # !isprint in the C locale: octal
    assert quote_char_data(b"x\ny") == b'"x\\n",\n    "y"'  # a newline starts a new string
    assert quote_char_data(b"\x00\x00") == b'""'


def test_string_data_escapes() -> None:
    assert quote_string_data(b"a\tb") == b'"a\\tb"'
    assert quote_string_data(b"v\x0bt") == b'"v\\nt"'  # ncstring_typ_tostring prints \v as \n
    assert quote_string_data("é".encode()) == '"é"'.encode()
    assert quote_string_data(b"ab\x00cd") == b'"ab"'  # a C string ends at the first NUL


@pytest.mark.parametrize(
    ("name", "escaped"),
    [
        ("plain_name", b"plain_name"),
        ("a b", b"a\\ b"),
        ("1st", b"\\1st"),
        ("x/y", b"x/y"),  # '/' is not escaped (group paths)
        ("a:b,c", b"a\\:b\\,c"),
        (
            "!\"#$&'()*,:;<=>?[]\\^`{|}~",
            b"\\!\\\"\\#\\$\\&\\'\\(\\)\\*\\,\\:\\;\\<\\=\\>\\?\\[\\]\\\\\\^\\`\\{\\|\\}\\~",
        ),
        ("a\x01b", b"a\\%01b"),
        ("température", "température".encode()),
        ("", b""),
    ],
)
def test_escaped_name(name: str, escaped: bytes) -> None:
    assert escaped_name(name) == escaped


@pytest.mark.parametrize("name", [" lead", "\tx"])
def test_escaped_name_refuses_leading_space_or_control(name: str) -> None:
    with pytest.raises(cdl_text.BadName):
        escaped_name(name)


# ========================================================================================= fill values
def test_integer_fill_marks() -> None:
    assert ValueFormatter("int", -1)(np.array([1, -1, 3], "i4")) == [b"1", b"_", b"3"]
    assert ValueFormatter("ubyte", None)(np.array([255], "u1")) == [b"255"]
    assert ValueFormatter("uint64", 2**64 - 2)(np.array([2**64 - 2, 2**64 - 1], "u8")) == [
        b"_",
        b"18446744073709551615",
    ]


def test_float_fill_uses_machine_epsilon() -> None:
    """ncfloat_val_equals: |fill - v| <= |FLT_EPSILON * v| counts as the fill; NaN equals NaN."""
    fill = np.float32(9.96921e36)
    near = np.nextafter(fill, np.float32(np.inf))
    far = np.float32(9.9e36)
    assert ValueFormatter("float", fill)(np.array([fill, near, far], np.float32)) == [b"_", b"_", b"9.9e+36"]
    assert ValueFormatter("float", np.float32(np.nan))(np.array([np.nan, 1], np.float32)) == [b"_", b"1"]
    assert ValueFormatter("double", -np.inf)(np.array([-np.inf, np.inf])) == [b"_", b"Infinity"]
    assert ValueFormatter("double", 9.969209968386869e36)(np.array([9.96921e36])) == [b"9.96921e+36"]


def test_empty_strings_are_null_in_nczarr() -> None:
    formatter = ValueFormatter("string", "")
    assert formatter(np.array(["a", ""], dtype=object)) == [b'"a"', b"NIL"]
    assert ValueFormatter("string", "x")(np.array(["x"], dtype=object)) == [b"_"]


def test_c_format_attribute_is_used_for_values() -> None:
    assert ValueFormatter("float", None, "%.2f")(np.array([1.5, np.nan], np.float32)) == [b"1.50", b"NaNf"]
    assert ValueFormatter("int", -1, "%5ld")(np.array([7, -1], "i4")) == [b"    7", b"_"]


# ======================================================================================= a small model
class FakeVariable:
    """The attributes of nczmap.format.Variable that the printer uses, over an in-memory array."""

    def __init__(
        self,
        group,
        name,
        dims,
        nctype,
        data,
        chunks=None,
        fill=0,
        attrs=(),
        order="<",
        codecs=None,
        shape=None,
    ):
        self.group, self.name, self.dims = group, name, tuple(dims)
        self.nctype = BY_NAME[nctype]
        self.data = np.asarray(data, dtype=self.nctype.numpy).reshape(shape or [d.size for d in dims])
        self.chunks = tuple(chunks or self.data.shape or (1,))
        self.fill_value = fill
        self.reads: list[int] = []
        self.attrs = type(group.attrs)()
        for attribute in attrs:
            self.attrs[attribute.name] = attribute
        storage = np.dtype(self.nctype.letter or "S1").newbyteorder(order) if self.nctype.letter else None
        dtype = ParsedDtype(self.nctype, storage, order in "<>" and self.nctype.numpy.itemsize > 1)
        chain = CodecChain(*(codecs or ([], None)))
        self.layout = SimpleNamespace(chunks=self.chunks, dtype=dtype, codecs=chain)
        group.variables[name] = self

    @property
    def shape(self):
        return self.data.shape

    def __getitem__(self, selection):
        result = self.data[selection]
        self.reads.append(np.asarray(result).size)
        return result


def make_root() -> Group:
    root = Group("/", None)
    root.dialect, root.provenance = Dialect.NCZARR_ATTRIBUTES, "version=2,netcdf=4.10.1,nczarr=2.0.0"
    return root


def add_dim(group: Group, name: str, size: int, unlimited: bool = False) -> Dimension:
    group.dimensions[name] = Dimension(name, size, unlimited, group)
    return group.dimensions[name]


def add_group(parent: Group, name: str) -> Group:
    parent.groups[name] = Group(name, parent)
    return parent.groups[name]


def dump(root: Group, **options) -> bytes:
    out = io.BytesIO()
    dump_cdl(root, out, **options)
    return out.getvalue()


# ============================================================================================== layout
def test_one_dimensional_row_wraps_at_80_columns() -> None:
    """lput: a value is moved to a new line (indent + 4 spaces) when linep + its length > 78."""
    root = make_root()
    n = add_dim(root, "n", 25)
    FakeVariable(root, "v", [n], "int", range(10000, 10025))
    text = dump(root, name="t")
    items = [f"{i}, " for i in range(10000, 10025)]
    # " v = " puts linep at 5; 10 items of 7 reach 75, the 11th would end at 82 > 78
    first = " v = " + "".join(items[:10])
    second = "\n    " + "".join(items[10:20])  # continuation: linep 4, again 10 items
    third = "\n    " + "".join(items[20:24]) + "10024 ;\n"
    assert text.endswith(("data:\n\n" + first + second + third + "}\n").encode())


def test_rows_of_a_matrix_and_record_braces() -> None:
    root = make_root()
    t, u = add_dim(root, "t", 2, unlimited=True), add_dim(root, "u", 2, unlimited=True)
    FakeVariable(root, "m", [t, u], "short", [1, 2, 3, 4])
    text = dump(root, name="t")
    assert b"\tt = UNLIMITED ; // (2 currently)\n" in text
    assert text.endswith(b"\n m =\n  {1, 2},\n  {3, 4} ;\n}\n")


def test_char_rows_are_strings_and_do_not_wrap() -> None:
    root = make_root()
    r, c = add_dim(root, "r", 2), add_dim(root, "c", 90)
    FakeVariable(root, "txt", [r, c], "char", [b"x"] * 90 + [b""] * 90)
    text = dump(root, name="t")
    assert text.endswith(b'\n txt =\n  "' + b"x" * 90 + b'",\n  "" ;\n}\n')


def test_group_layout_and_scalars() -> None:
    root = make_root()
    g = add_group(root, "g")
    g.attrs["title"] = "in g"
    FakeVariable(
        g, "s", [], "double", [0.5], attrs=[Attribute("_FillValue", BY_NAME["double"], np.array([0.5]))]
    )
    text = dump(root, name="t")
    expected = (
        b"netcdf t {\n\ngroup: g {\n  variables:\n  \tdouble s ;\n  \t\ts:_FillValue = 0.5 ;\n\n"
        b'  // group attributes:\n  \t\t:title = "in g" ;\n  data:\n\n   s = _ ;\n  } // group g\n}\n'
    )
    assert text == expected


def test_keyword_variable_names_get_a_space_before_the_colon() -> None:
    root = make_root()
    n = add_dim(root, "n", 1)
    FakeVariable(root, "data", [n], "int", [1], attrs=[Attribute("units", BY_NAME["char"], "m")])
    assert b'\t\tdata :units = "m" ;\n' in dump(root, header_only=True)


def test_special_attributes_of_a_scalar_leave_chunk_sizes_unterminated() -> None:
    """pr_att_specials prints the _ChunkSizes values and their " ;\\n" in one loop over the dimensions."""
    root = make_root()
    FakeVariable(root, "s", [], "int", [1])
    FakeVariable(root, "b", [], "byte", [1], fill=None)
    text = dump(root, header_only=True, special=True)
    assert b'\t\ts:_ChunkSizes = \t\ts:_Endianness = "little" ;\n' in text
    assert b'\t\tb:_ChunkSizes = \t\tb:_NoFill = "true" ;\n' in text


def test_special_attributes_and_globals() -> None:
    root = make_root()
    n = add_dim(root, "n", 8)
    codecs = ([{"id": "shuffle", "elementsize": 4}], {"id": "bz2", "level": 9})
    FakeVariable(root, "v", [n], "float", range(8), chunks=(4,), order=">", codecs=codecs)
    text = dump(root, header_only=True, special=True)
    assert text == (
        b"netcdf dataset {\ndimensions:\n\tn = 8 ;\nvariables:\n\tfloat v(n) ;\n"
        b'\t\tv:_Storage = "chunked" ;\n\t\tv:_ChunkSizes = 4 ;\n\t\tv:_Shuffle = "true" ;\n'
        b'\t\tv:_Filter = "307,9" ;\n'
        b'\t\tv:_Codecs = "[{\\"id\\": \\"shuffle\\", \\"elementsize\\": 4},'
        b'{\\"id\\": \\"bz2\\", \\"level\\": 9}]" ;\n'
        b'\t\tv:_Endianness = "big" ;\n\n// global attributes:\n'
        b'\t\t:_NCProperties = "version=2,netcdf=4.10.1,nczarr=2.0.0" ;\n\t\t:_SuperblockVersion = 2 ;\n'
        b'\t\t:_IsNetcdf4 = 1 ;\n\t\t:_Format = "netCDF-4" ;\n}\n'
    )


def test_values_beyond_a_shorter_array_are_fill_values() -> None:
    """ncdump prints the dimension's current length; an array an unlimited dimension outgrew reads as fill."""
    root = make_root()
    t, n = add_dim(root, "t", 3, unlimited=True), add_dim(root, "n", 2)
    FakeVariable(root, "v", [t, n], "int", [1, 2], fill=-1, shape=(1, 2))
    FakeVariable(root, "z", [t], "float", [0.5], fill=None, shape=(1,))
    text = dump(root, name="t")
    assert text.endswith(b"\n v =\n  1, 2,\n  -1, -1,\n  -1, -1 ;\n\n z = 0.5, 0, 0 ;\n}\n")


def test_empty_unlimited_dimension_has_no_data_entry() -> None:
    root = make_root()
    e = add_dim(root, "e", 0, unlimited=True)
    FakeVariable(root, "v", [e], "int", [])
    assert dump(root, name="t").endswith(b"\tint v(e) ;\ndata:\n}\n")


# ===================================================================================== dimension names
def test_dimension_references() -> None:
    root = make_root()
    x, y = add_dim(root, "x", 2), add_dim(root, "y", 3)
    g1 = add_group(root, "g1")
    g2 = add_group(g1, "g2")
    g2y = add_dim(g2, "y", 4)
    other = add_group(root, "other")
    w = add_dim(other, "w", 1)
    assert dimension_reference(g2, x) == b"x"  # inherited, not shadowed
    assert dimension_reference(g2, g2y) == b"y"
    # shadowed: ncdump's upward search stops in g1 (whose nearest "y" is the root's) and names g1
    assert dimension_reference(g2, y) == b"/g1/y"
    assert dimension_reference(g1, y) == b"y"
    assert dimension_reference(g2, w) == b"/other/w"  # not an ancestor's: found by a tree search
    g1y = add_dim(g1, "y", 5)
    assert dimension_reference(g2, g1y) == b"/g1/y"
    assert dimension_reference(g2, y) == b"/y"


# ================================================================================================== -v
def test_variable_selection_rules() -> None:
    root = make_root()
    n = add_dim(root, "n", 1)
    FakeVariable(root, "v", [n], "int", [1])
    g = add_group(root, "xg1")
    FakeVariable(g, "v", [n], "int", [2])
    FakeVariable(g, "w", [n], "int", [3])
    text = dump(root, name="t", variables=["g1/w"])  # strendswith("/xg1", "g1")
    assert b" w = 3 ;" in text and b" v = " not in text
    assert b" v = 1 ;" in dump(root, variables=["v"]) and b" v = 2 ;" in dump(root, variables=["v"])
    with pytest.raises(NoSuchVariable, match="/v: No such variable"):
        dump(root, variables=["/v"])  # "/" (the root's full name) is not "" (the text before "/v")
    assert b" w = 3 ;" in dump(root, variables=["/xg1/w"])


# ===================================================================================== streams, memory
def test_text_streams_receive_str() -> None:
    root = make_root()
    root.attrs["t"] = "é"
    out = io.StringIO()
    dump_cdl(root, out, name="x")
    assert out.getvalue() == 'netcdf x {\n\n// global attributes:\n\t\t:t = "é" ;\n}\n'


def test_data_is_read_in_bounded_slabs(monkeypatch) -> None:
    monkeypatch.setattr(cdl, "SLAB_ELEMENTS", 100)
    root = make_root()
    a, b = add_dim(root, "a", 30), add_dim(root, "b", 7)
    matrix = FakeVariable(root, "m", [a, b], "int", range(210), chunks=(4, 7))
    line = FakeVariable(root, "l", [add_dim(root, "c", 450)], "int", range(450), chunks=(30,))
    wide = FakeVariable(
        root, "w", [add_dim(root, "d", 2), add_dim(root, "e", 250)], "int", range(500), chunks=(1, 50)
    )
    text = dump(root, name="t")
    assert max(matrix.reads) <= 100 and sum(matrix.reads) == 210
    assert max(line.reads) <= 100 and sum(line.reads) == 450
    assert max(wide.reads) <= 100 and sum(wide.reads) == 500
    assert b"  203, 204, 205, 206, 207, 208, 209 ;\n" in text
    assert b"448, 449 ;\n" in text
