// A small PNG reader for the desktop tests: enough of the format (8-bit
// RGB or RGBA, not interlaced: what scrot writes) to tell a blank screen
// from a drawn one, without a dependency.
import zlib from 'node:zlib'

const SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

// isPNG reports whether buf starts with the PNG signature.
export function isPNG(buf) {
  return buf.length > 8 && Buffer.from(buf.buffer, buf.byteOffset, 8).equals(SIGNATURE)
}

// decodePNG returns { width, height, channels, pixels } (pixels: the
// unfiltered rows, channels bytes a pixel).
export function decodePNG(bytes) {
  if (!isPNG(bytes)) throw new Error('not a PNG')
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  let off = 8
  let width, height, channels
  const idat = []
  while (off < buf.length) {
    const len = buf.readUInt32BE(off)
    const type = buf.toString('latin1', off + 4, off + 8)
    const data = buf.subarray(off + 8, off + 8 + len)
    if (type === 'IHDR') {
      width = data.readUInt32BE(0)
      height = data.readUInt32BE(4)
      const depth = data[8], colour = data[9], interlace = data[12]
      if (depth !== 8 || interlace !== 0 || (colour !== 2 && colour !== 6)) {
        throw new Error(`unsupported PNG: depth ${depth}, colour type ${colour}, interlace ${interlace}`)
      }
      channels = colour === 2 ? 3 : 4
    } else if (type === 'IDAT') {
      idat.push(data)
    } else if (type === 'IEND') {
      break
    }
    off += 12 + len
  }
  const raw = zlib.inflateSync(Buffer.concat(idat))
  const stride = width * channels
  const pixels = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const out = pixels.subarray(y * stride, (y + 1) * stride)
    const prev = y > 0 ? pixels.subarray((y - 1) * stride, y * stride) : Buffer.alloc(stride)
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? out[i - channels] : 0
      const b = prev[i]
      const c = i >= channels ? prev[i - channels] : 0
      let v = line[i]
      switch (filter) {
        case 0: break
        case 1: v += a; break
        case 2: v += b; break
        case 3: v += (a + b) >> 1; break
        case 4: {
          const p = a + b - c
          const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c)
          v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c
          break
        }
        default: throw new Error(`bad PNG filter ${filter}`)
      }
      out[i] = v & 0xff
    }
  }
  return { width, height, channels, pixels }
}

// pngStats decodes buf and returns its size, how many distinct colours it
// has, and the share of pixels that have its most common colour.
export function pngStats(buf) {
  const { width, height, channels, pixels } = decodePNG(buf)
  const counts = new Map()
  for (let i = 0; i < pixels.length; i += channels) {
    const rgb = (pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2]
    counts.set(rgb, (counts.get(rgb) ?? 0) + 1)
  }
  const top = Math.max(...counts.values())
  return { width, height, colours: counts.size, dominant: top / (width * height) }
}

// blank reports whether a screenshot shows nothing: (nearly) one colour.
// A mouse pointer on a black screen is blank.
export function blank(stats) {
  return stats.colours < 16 || stats.dominant > 0.99
}
