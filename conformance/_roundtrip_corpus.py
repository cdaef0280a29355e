"""The CDL corpus of ``test_format_roundtrip.py``: every dataset is compiled by real ``ncgen``.

Each case is plain CDL plus what the tests need to know about it *as written* (never as nczmap reads it):

* ``ncgen49``: Debian ``ncgen`` 4.9.0 can write it to NCZarr/pure Zarr (no string, unlimited or scalar
  variables, no big-endian data - spec §3.4 and bug 18 - and no compression, which 4.9.0 ignores, §6).
* ``d0_d2``: nczmap can write it for netcdf-c 4.8.0-4.9.2 (no strings before 4.9.1, no unlimited before
  4.9.3, no scalars in 4.9.0, §3.3-§3.5).
* ``unwritten``: variables the CDL gives no data (their chunks must stay missing).
* ``regions``: variables the netCDF4-python copier writes only partly (chunk-aligned and not), so the
  store has missing chunks next to chunks netcdf-c completed with the fill value; the CDL marks the
  other elements ``_``.
* ``json_char``: char attributes whose text parses as JSON. netcdf-c 4.10 writes the *parsed* JSON
  (spec §4.3 "JSON convention", bug 20); the entry gives what a reader of such a store sees, from the
  spec's worked examples: the text in NCZarr mode (re-serialised the way netcdf-c prints JSON) and
  the inferred ``(type, values)`` in pure-Zarr mode, where no type information is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    name: str
    cdl: str
    ncgen49: bool
    d0_d2: bool
    unwritten: frozenset[str] = frozenset()
    regions: dict[str, tuple[slice, ...]] = field(default_factory=dict)
    json_char: dict[str, tuple[str, tuple[str, tuple]]] = field(default_factory=dict)


# Char attribute texts that are JSON: CDL text -> (NCZarr text, (pure-Zarr type, pure-Zarr values)).
JSON_CHAR = {
    "[1, 2, 3]": ("[1,2,3]", ("int", (1, 2, 3))),  # arrays print without blanks
    "42": ("42", ("int", (42,))),
    "true": ("true", ("ubyte", (1,))),  # boolean -> ubyte (§4.3)
    '{"a":1}': ('{"a": 1}', ("char", '{"a": 1}')),  # dicts stay text, members as '"k": v'
}

ATOMIC_JSON_ATTRS = {"json_arr": "[1, 2, 3]", "json_num": "42", "json_bool": "true", "json_obj": '{"a":1}'}

ATOMIC = r"""netcdf atomic {
dimensions:
	x = 3 ;
	y = 4 ;
	n = 6 ;
variables:
	byte vb(x) ;
		vb:_FillValue = -2b ;
		vb:ab = -128b, 0b, 127b ;
	ubyte vub(x) ;
		vub:aub = 0UB, 255UB ;
	short vs(x, y) ;
		vs:as = -32768s, 32767s ;
	ushort vus(y) ;
		vus:aus = 65535US ;
	int vi(x, y) ;
		vi:_FillValue = -1 ;
		vi:ai = -2147483647, 2147483647 ;
		vi:units = "m/s" ;
	uint vui(y) ;
		vui:aui = 4294967295U ;
	int64 vi64(y) ;
		vi64:ai64 = -9223372036854775807LL, 9223372036854775807LL ;
	uint64 vu64(y) ;
		vu64:au64 = 18446744073709551615ULL ;
	float vf(n) ;
		vf:_FillValue = 3.1415927f ;
		vf:af = 0.1f, -1.e+30f, 3.4028235e+38f ;
		vf:fnan = NaNf ;
	double vd(x) ;
		vd:ad = 3.14159265358979, 1.e-300 ;
		vd:one = 1. ;
		vd:dinf = Infinity, -Infinity ;
	char vc(x, y) ;
		vc:text = "héllo wörld ☃" ;
	double nodata_d(x) ;
	float nodata_f(y) ;
		nodata_f:_FillValue = 0.123456789f ;
	int nodata_i(x) ;
	float nodata_nan(y) ;
		nodata_nan:_FillValue = NaNf ;
		nodata_nan:empty = "" ;
	double part_d(n) ;
		part_d:_ChunkSizes = 2 ;
	short part_s(n) ;
		part_s:_FillValue = 99s ;
		part_s:_ChunkSizes = 4 ;

// global attributes:
		:title = "every atomic type" ;
		:gb = -1b ;
		:gub = 200UB ;
		:gs = -300s ;
		:gus = 60000US ;
		:gi = 42 ;
		:gui = 3000000000U ;
		:gi64 = -5000000000LL ;
		:gu64 = 10000000000000000000ULL ;
		:gf = 2.5f, 1.e-10f ;
		:gd = 0.1, 2.718281828459045 ;
		:quote = "say \"hi\" \\ back\nslash\ttab" ;
		:json_arr = "[1, 2, 3]" ;
		:json_num = "42" ;
		:json_bool = "true" ;
		:json_obj = "{\"a\":1}" ;
data:

 vb = -128, _, 127 ;

 vub = 0, 1, 255 ;

 vs = -32768, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 32767 ;

 vus = 0, 1, 65534, _ ;

 vi = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, _ ;

 vui = 0, 4294967294, 7, _ ;

 vi64 = -9223372036854775807, 0, 1, 9223372036854775807 ;

 vu64 = 0, 1, 18446744073709551613, 18446744073709551615 ;

 vf = 1.5, _, -2.25, 3.4028235e+38, 1.e-38, 0.1 ;

 vd = 3.14159265358979, 1e+300, -0 ;

 vc =
  "abcd",
  "ef",
  "ghé" ;

 part_d = 1.5, 2.5, _, _, _, 6.5 ;

 part_s = 1, 2, _, _, _, 6 ;
}
"""

GROUPS = r"""netcdf groups {
dimensions:
	x = 2 ;
	y = 3 ;
variables:
	int rv(x, y) ;
		rv:_FillValue = -99 ;
		rv:long_name = "root variable" ;

// global attributes:
		:gattr = "root" ;
data:

 rv = 1, 2, 3, 4, 5, _ ;

group: g1 {
  dimensions:
	z = 4 ;
  variables:
	double gv(y, z) ;
		gv:units = "K" ;
	float gz(z) ;

  // group attributes:
		:g1attr = 1.5 ;
		:g1int = 7 ;
  data:

   gv = 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5 ;

   gz = 1, 2, 3, 4 ;

  group: g2 {
    dimensions:
	w = 2 ;
    variables:
	short deep(x, z, w) ;
		deep:note = "dims from root, parent and self" ;
	ubyte u(w) ;

    // group attributes:
		:level = 2s ;
    data:

     deep = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 ;

     u = 7, 8 ;
    } // group g2
  } // group g1

group: g3 {
  dimensions:
	x = 5 ;
  variables:
	int shadow(x) ;
	uint64 big(y) ;
  data:

   shadow = 1, 2, 3, 4, 5 ;

   big = 0, 1, 18446744073709551615 ;
  } // group g3

group: g4 {

  // group attributes:
		:only = "attributes here" ;
  } // group g4
}
"""

ENCODING = r"""netcdf encoding {
dimensions:
	x = 6 ;
	y = 4 ;
variables:
	int be_i(x) ;
		be_i:_Endianness = "big" ;
	double be_d(x) ;
		be_d:_FillValue = -1.5 ;
		be_d:_Endianness = "big" ;
	short be_s(x, y) ;
		be_s:_Endianness = "big" ;
		be_s:_Shuffle = "true" ;
		be_s:_DeflateLevel = 2 ;
		be_s:_ChunkSizes = 3, 2 ;
	float zf(x, y) ;
		zf:_DeflateLevel = 6 ;
		zf:_Shuffle = "true" ;
		zf:_ChunkSizes = 2, 4 ;
	int64 zi(x) ;
		zi:_DeflateLevel = 1 ;
	int nofill(x) ;
		nofill:_NoFill = "true" ;
	uint64 be_u64(y) ;
		be_u64:_Endianness = "big" ;
data:

 be_i = 1, -2, 3, -4, 2147483647, _ ;

 be_d = 0.1, _, 1e-300, -2.5, 3, 1e300 ;

 be_s = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, -32768 ;

 zf = 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5, 8, 8.5, 9, 9.5, 10, 10.5, 11, 11.5 ;

 zi = -9000000000000000000, 1, 2, 3, 4, 9000000000000000000 ;

 nofill = 6, 5, 4, 3, 2, 1 ;

 be_u64 = 0, 1, 2, 18446744073709551615 ;
}
"""

STRINGS = r"""netcdf strings {
dimensions:
	t = UNLIMITED ;
	x = 5 ;
variables:
	string names(x) ;
		names:long_name = "names" ;
		string names:tags = "a", "bé", "" ;
	string nodata_s(x) ;
	int scal ;
		scal:_FillValue = -9 ;
	double dscal ;
	string sscal ;
	char cscal ;
	double temp(t, x) ;
		temp:_ChunkSizes = 2, 5 ;
		temp:_DeflateLevel = 4 ;
		temp:_Shuffle = "true" ;
	int count(t) ;
		count:_DeflateLevel = 1 ;
	float be_f(t) ;
		be_f:_Endianness = "big" ;
	int nodata_t(t) ;

// global attributes:
		string :gs = "glob" ;
		string :gmulti = "x", "yy", "ü" ;
		:gc = "chars" ;
data:

 names = "hello", "", "wörld", _, "x" ;

 scal = 17 ;

 dscal = 2.5 ;

 sscal = "scalar" ;

 cscal = "z" ;

 temp =
  1, 2, 3, 4, 5,
  6, 7, 8, 9, 10,
  11, 12, 13, 14, 15 ;

 count = 1, 2, 3 ;

 be_f = 0.5, -1.5, 3.4028235e+38 ;
}
"""

CASES = {
    case.name: case
    for case in (
        Case(
            "atomic",
            ATOMIC,
            ncgen49=True,
            d0_d2=True,
            unwritten=frozenset({"/nodata_d", "/nodata_f", "/nodata_i", "/nodata_nan"}),
            regions={"/part_d": (slice(0, 2), slice(5, 6)), "/part_s": (slice(0, 2), slice(5, 6))},
            json_char={name: JSON_CHAR[text] for name, text in ATOMIC_JSON_ATTRS.items()},
        ),
        Case("groups", GROUPS, ncgen49=True, d0_d2=True),
        Case("encoding", ENCODING, ncgen49=False, d0_d2=True),
        Case(
            "strings",
            STRINGS,
            ncgen49=False,
            d0_d2=False,
            unwritten=frozenset({"/nodata_s", "/nodata_t"}),
        ),
    )
}
