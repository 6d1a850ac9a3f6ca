"""Built-in word tables for the text perturbations: nothing is downloaded.

Small on purpose: they cover the words of captions and document lines (the built-in datasets,
everyday English), not the language. A word outside a table is simply not eligible for the
perturbation that needs the table.
"""

from __future__ import annotations

# Synonyms (EDA/MMRobustness synonym replacement and insertion), lower case.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "small": ("little", "tiny", "compact"), "little": ("small", "tiny"), "tiny": ("small", "little"),
    "large": ("big", "huge", "sizeable"), "big": ("large", "huge"), "huge": ("enormous", "giant"),
    "medium": ("mid-sized", "moderate", "average"), "photo": ("picture", "photograph", "image", "snapshot"),
    "picture": ("photo", "image"), "image": ("picture", "photo"), "showing": ("depicting", "displaying"),
    "background": ("backdrop", "setting"), "top": ("upper", "uppermost"), "bottom": ("lower", "lowest"),
    "center": ("centre", "middle"), "middle": ("center", "centre"), "left": ("left-hand",), "right": ("right-hand",),
    "over": ("above", "across"), "on": ("upon", "atop"), "shape": ("form", "figure"), "gray": ("grey",),
    "grey": ("gray",), "dark": ("dim", "deep"), "beige": ("tan", "sand-coloured"), "man": ("guy", "gentleman"),
    "woman": ("lady",), "person": ("individual", "human"), "people": ("persons", "folks"), "child": ("kid",),
    "dog": ("puppy", "hound"), "cat": ("kitten", "feline"), "car": ("automobile", "vehicle"), "house": ("home",),
    "road": ("street", "roadway"), "street": ("road",), "walking": ("strolling",), "running": ("jogging",),
    "sitting": ("seated",), "standing": ("upright",), "looking": ("gazing", "staring"), "holding": ("carrying",),
    "quick": ("fast", "rapid"), "fast": ("quick", "speedy"), "slow": ("sluggish",), "happy": ("glad", "cheerful"),
    "sad": ("unhappy",), "beautiful": ("pretty", "lovely"), "old": ("aged", "elderly"), "new": ("fresh", "recent"),
    "total": ("sum", "overall"), "amount": ("sum", "quantity"), "invoice": ("bill",), "payment": ("remittance",),
    "customer": ("client",), "order": ("purchase",), "delivery": ("shipment",), "receipt": ("voucher",),
    "price": ("cost",), "store": ("shop",), "shop": ("store",), "meeting": ("gathering",), "report": ("account",),
    "ready": ("prepared",), "closed": ("shut",), "open": ("unlocked",), "urgent": ("pressing",),
    "street sign": ("road sign",), "near": ("close to", "beside"), "next": ("adjacent",), "field": ("meadow",),
    "water": ("lake",), "sky": ("heavens",), "tree": ("sapling",), "building": ("structure", "edifice"),
    "table": ("desk",), "plate": ("dish",), "food": ("meal",), "bright": ("vivid", "brilliant"),
}  # fmt: skip

# Key words and a Chinese, Spanish and German equivalent (code-switching).
CODE_SWITCH: dict[str, dict[str, str]] = {
    "red": {"zh": "红色", "es": "rojo", "de": "rot"},
    "green": {"zh": "绿色", "es": "verde", "de": "grün"},
    "blue": {"zh": "蓝色", "es": "azul", "de": "blau"},
    "yellow": {"zh": "黄色", "es": "amarillo", "de": "gelb"},
    "purple": {"zh": "紫色", "es": "morado", "de": "lila"},
    "orange": {"zh": "橙色", "es": "naranja", "de": "orange"},
    "black": {"zh": "黑色", "es": "negro", "de": "schwarz"},
    "white": {"zh": "白色", "es": "blanco", "de": "weiß"},
    "gray": {"zh": "灰色", "es": "gris", "de": "grau"},
    "grey": {"zh": "灰色", "es": "gris", "de": "grau"},
    "beige": {"zh": "米色", "es": "beige", "de": "beige"},
    "circle": {"zh": "圆形", "es": "círculo", "de": "Kreis"},
    "square": {"zh": "正方形", "es": "cuadrado", "de": "Quadrat"},
    "triangle": {"zh": "三角形", "es": "triángulo", "de": "Dreieck"},
    "cross": {"zh": "十字", "es": "cruz", "de": "Kreuz"},
    "small": {"zh": "小", "es": "pequeño", "de": "klein"},
    "medium": {"zh": "中等", "es": "mediano", "de": "mittel"},
    "large": {"zh": "大", "es": "grande", "de": "groß"},
    "top": {"zh": "顶部", "es": "arriba", "de": "oben"},
    "bottom": {"zh": "底部", "es": "abajo", "de": "unten"},
    "left": {"zh": "左边", "es": "izquierda", "de": "links"},
    "right": {"zh": "右边", "es": "derecha", "de": "rechts"},
    "center": {"zh": "中心", "es": "centro", "de": "Mitte"},
    "middle": {"zh": "中间", "es": "medio", "de": "Mitte"},
    "background": {"zh": "背景", "es": "fondo", "de": "Hintergrund"},
    "photo": {"zh": "照片", "es": "foto", "de": "Foto"},
    "image": {"zh": "图像", "es": "imagen", "de": "Bild"},
    "picture": {"zh": "图片", "es": "imagen", "de": "Bild"},
    "dog": {"zh": "狗", "es": "perro", "de": "Hund"},
    "cat": {"zh": "猫", "es": "gato", "de": "Katze"},
    "car": {"zh": "汽车", "es": "coche", "de": "Auto"},
    "man": {"zh": "男人", "es": "hombre", "de": "Mann"},
    "woman": {"zh": "女人", "es": "mujer", "de": "Frau"},
    "person": {"zh": "人", "es": "persona", "de": "Person"},
    "house": {"zh": "房子", "es": "casa", "de": "Haus"},
    "street": {"zh": "街道", "es": "calle", "de": "Straße"},
    "tree": {"zh": "树", "es": "árbol", "de": "Baum"},
    "water": {"zh": "水", "es": "agua", "de": "Wasser"},
    "food": {"zh": "食物", "es": "comida", "de": "Essen"},
    "invoice": {"zh": "发票", "es": "factura", "de": "Rechnung"},
    "total": {"zh": "总计", "es": "total", "de": "Summe"},
    "amount": {"zh": "金额", "es": "importe", "de": "Betrag"},
    "date": {"zh": "日期", "es": "fecha", "de": "Datum"},
    "due": {"zh": "到期", "es": "vence", "de": "fällig"},
    "paid": {"zh": "已付", "es": "pagado", "de": "bezahlt"},
    "price": {"zh": "价格", "es": "precio", "de": "Preis"},
    "order": {"zh": "订单", "es": "pedido", "de": "Bestellung"},
    "customer": {"zh": "客户", "es": "cliente", "de": "Kunde"},
}
LANGUAGES = ("zh", "es", "de")

# Attribute categories for the attribute swap ("red circle" -> "blue circle"); a word is swapped
# for another value of its own category.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "colour": ("red", "green", "blue", "yellow", "purple", "orange", "black", "white", "pink", "brown"),
    "shape": ("circle", "square", "triangle", "cross"),
    "size": ("small", "medium", "large"),
    "vertical": ("top", "middle", "bottom"),
    "horizontal": ("left", "center", "right"),
    "background": ("gray", "beige"),
    "animal": ("dog", "cat", "horse", "bird", "cow", "sheep"),
    "person": ("man", "woman", "boy", "girl"),
    "count": ("one", "two", "three", "four", "five"),
    "state": ("open", "closed"),
    "time": ("day", "night"),
    "temperature": ("hot", "cold"),
}
ATTRIBUTE_OF: dict[str, str] = {value: cat for cat, values in ATTRIBUTES.items() for value in values}

# Characters OCR engines confuse, as (seen, read) pairs; multi-character on either side.
OCR_CONFUSIONS: tuple[tuple[str, str], ...] = (
    ("rn", "m"), ("m", "rn"), ("cl", "d"), ("d", "cl"), ("vv", "w"), ("w", "vv"), ("l", "1"), ("1", "l"),
    ("I", "l"), ("l", "I"), ("O", "0"), ("0", "O"), ("o", "0"), ("S", "5"), ("5", "S"), ("B", "8"),
    ("8", "B"), ("Z", "2"), ("2", "Z"), ("g", "9"), ("q", "g"), ("e", "c"), ("c", "e"), ("a", "o"),
    ("u", "v"), ("v", "u"), ("h", "b"), ("n", "h"), ("i", "j"), ("t", "f"), ("f", "t"), ("E", "F"),
    ("G", "6"), ("6", "G"), ("T", "7"), ("A", "4"),
)  # fmt: skip

# Negation forms by severity, from a one-word change to an explicit sentence: {np} is the text,
# {bare} the text without its leading article; "no-article" turns the first article into "no".
NEGATION_FORMS: tuple[str, ...] = (
    "no-article",
    "not {np}",
    "there is no {bare}",
    "this is not {np}",
    "no, this is not {np}",
)

# Neutral filler for padding a text past the tokenizer's context window.
FILLER = [
    "please",
    "note",
    "that",
    "the",
    "following",
    "description",
    "was",
    "generated",
    "automatically",
    "and",
    "may",
    "contain",
    "additional",
    "details",
    "that",
    "are",
    "not",
    "relevant",
    "for",
    "the",
    "task",
    "at",
    "hand",
    "so",
    "read",
    "on",
]

# Neutral words EDA inserts when a text has no word with a synonym in the table.
INSERT_FALLBACK = ("very", "really", "just", "quite", "also", "here")
PUNCTUATION = (".", ",", ";", ":", "!", "?")
