"""The tiled form of a transposing copy, for dialects whose lanes are loop iterations of one
thread (which kernels: gir/ir/transpose_tiles.py, shared with the time model)."""
from __future__ import annotations

from gir.ir.transpose_tiles import TILE, TransposeCopy, transpose_copy

from .cstyle import affine_c, block
from .kernels import Kernel


class TransposeTiles:
    """Mixin before the dialect's other bases: a kernel that is a transposing copy runs as
    16x16 tiles, `gir_tile16` where the prelude defines GIR_TILE16 and the element type is
    float, element loops over the tile otherwise; every other kernel as the bases emit it."""
    across = False
    tile_transposes = True  # False: the per-unit loop with a gather (an A/B baseline)

    def kernel_body(self, k: Kernel) -> list[str]:
        tiled = self.tile_transposes and not self.across
        tiles = transpose_copy([op for _, op in k.ops], k.buffers, k.prim) if tiled else None
        if tiles is None:
            return super().kernel_body(k)
        self.k, self.names = k, self._names(k)
        return [*self.prologue(k), *self.transpose_tiles(tiles)]

    def transpose_tiles(self, t: TransposeCopy) -> list[str]:
        ctype, n = self.types[self.k.buffers[t.src.buffer].dtype], TILE
        tile = (f"if (a0 + {n} <= {t.rows} && c0 + {n} <= {t.cols}) {{ gir_tile16(ts + a0 + {t.src_row}L * c0, "
                f"{t.src_row}, td + {t.dst_row}L * a0 + c0, {t.dst_row}); continue; }}")
        whole = ["#ifdef GIR_TILE16", tile, "#endif"] if ctype == "float" else []
        element = [f"for (int c = c0; c < c1; ++c) td[{t.dst_row}L * a + c] = ts[a + {t.src_row}L * c];"]
        per_tile = [*whole, f"const int a1 = a0 + {n} < {t.rows} ? a0 + {n} : {t.rows}, "
                            f"c1 = c0 + {n} < {t.cols} ? c0 + {n} : {t.cols};",
                    *block("for (int a = a0; a < a1; ++a) {", [*([self.simd_pragma] if self.simd_pragma else []), *element])]
        return block("{", [
            f"const {ctype}* {self.restrict} ts = {self.names[t.src.buffer]} + {affine_c(t.src.offset)};",
            f"{ctype}* {self.restrict} td = {self.names[t.dst.buffer]} + {affine_c(t.dst.offset)};",
            *block(f"for (int a0 = 0; a0 < {t.rows}; a0 += {n}) {{",
                   block(f"for (int c0 = 0; c0 < {t.cols}; c0 += {n}) {{", per_tile))])
