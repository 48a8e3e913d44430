# ruff: noqa: RUF001  (Chinese and typographic punctuation are the point here)
"""Guards: features of a question that must agree before a similar cached answer is served.

Embedding similarity cannot see the difference between "safe" and "unsafe", 48213 and 48231,
Beijing and Shanghai: they score 0.95-0.99 with MiniLM. Each guard extracts the facts that decide
the answer (numbers, dates, named entities, negations and antonyms, scope words, who acts, code
and operators, emoji, and for Chinese the content characters) and a hit needs every one of them
to agree. All pure, English and Chinese.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from workers.cache.normalize import CODE_SPAN, canonical, has_cjk

_WORD = re.compile(r"[a-z0-9]+(?:[.'-][a-z0-9]+)*")
_RAW_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[.'-][A-Za-z0-9]+)*")
_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")

_EN_NUMBERS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "fifteen": "15", "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50",
    "hundred": "100", "thousand": "1000", "million": "1e6", "billion": "1e9", "dozen": "12",
    "half": "0.5", "twice": "2x", "double": "2x", "triple": "3x", "single": "1",
    "first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "last": "last",
}  # fmt: skip
_ZH_DIGITS = {
    "零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5,
    "六": 6, "七": 7, "八": 8, "九": 9,
}  # fmt: skip
_ZH_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10_000, "亿": 100_000_000}
_ZH_NUMERAL = re.compile(r"[零〇一二两三四五六七八九十百千万亿]+")
# Words where a numeral character is not a number ("一下", "一些", "万一", "统一" ...).
_ZH_NUMERAL_IDIOMS = ("一下", "一些", "一样", "一起", "一直", "一般", "万一", "统一", "唯一",
                      "一定", "一点", "一种", "一个", "一次", "同一", "第一次", "千万", "一切",
                      "十分", "百度", "三星", "一旦")  # fmt: skip

_EN_DATES = {
    "today", "tomorrow", "yesterday", "tonight", "morning", "afternoon",
    "evening", "night", "weekend", "weekday", "week", "month", "year", "daily", "weekly",
    "monthly", "yearly", "annual", "annually", "hourly", "monday", "tuesday", "wednesday",
    "thursday", "friday", "saturday", "sunday", "january", "february", "march", "april",
    "june", "july", "august", "september", "october", "november", "december", "jan", "feb",
    "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "spring", "summer",
    "autumn", "winter", "next", "previous", "ago",
}  # fmt: skip
_ZH_DATES = ("今天", "明天", "昨天", "后天", "前天", "今晚", "明晚", "今年", "明年", "去年",
             "本周", "下周", "上周", "这周", "本月", "下个月", "上个月", "这个月", "周末",
             "早上", "上午", "中午", "下午", "晚上", "夜里", "凌晨", "星期", "周一", "周二",
             "周三", "周四", "周五", "周六", "周日", "春天", "夏天", "秋天", "冬天", "现在",
             "目前", "每天", "每周", "每月", "每年")  # fmt: skip

# Negation markers. English "no"/"not" and the prefixes un-/in-/dis- are handled separately.
_EN_NEGATIONS = {"not", "no", "never", "without", "none", "nothing", "nobody", "neither", "nor",
                 "cannot", "shouldn't", "don't", "doesn't", "isn't",
                 # A verb that says "not": "what should I avoid before a run" / "... eat ...".
                 "avoid", "prevent"}  # fmt: skip
_ZH_NEGATIONS = ("不", "没", "无", "非", "未", "别", "勿", "否")
# Chinese words that contain a negation character but do not negate the sentence.
_ZH_NEG_IDIOMS = ("不过", "不同", "不少", "无论", "并非", "非常", "别人", "别的", "区别",
                  "差不多", "不断", "无线", "是否", "否则", "未来")  # fmt: skip
_NEG_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "non-", "anti")

# Antonym groups: the first member is one side, the rest the other ("safe" / "dangerous",
# "risky", "harmful"); two questions on different sides of a group ask opposite things.
_EN_ANTONYMS = (
    ("safe", "dangerous", "risky", "harmful"), ("increase", "decrease", "reduce", "lower"),
    ("raise", "lower"), ("buy", "sell"), ("before", "after"), ("min", "max"),
    ("minimum", "maximum"), ("open", "close"), ("enable", "disable"), ("add", "remove", "delete"),
    ("upload", "download"), ("import", "export"), ("start", "stop", "end"), ("best", "worst"),
    ("cheapest", "most expensive"), ("cheap", "expensive"), ("hot", "cold"),
    ("more", "less", "fewer"),
    ("higher", "lower"), ("high", "low"), ("first", "last"), ("male", "female"), ("men", "women"),
    ("win", "lose"), ("gain", "lose"), ("turn on", "turn off"), ("switch on", "switch off"),
    ("speed up", "slow down"), ("freeze", "thaw", "defrost"), ("indoor", "outdoor"),
    ("indoors", "outdoors"), ("zip", "unzip"), ("login", "logout"), ("log in", "log out"),
    ("sign in", "sign out"), ("encrypt", "decrypt"),
    ("compress", "decompress"), ("install", "uninstall"), ("subscribe", "unsubscribe"),
    ("lock", "unlock"), ("follow", "unfollow"), ("block", "unblock"), ("mute", "unmute"),
    ("allow", "deny", "block"), ("accept", "reject", "decline"), ("true", "false"),
    ("pros", "cons"), ("advantages", "disadvantages"), ("benefits", "risks", "drawbacks"),
    ("fastest", "slowest"), ("fast", "slow"), ("largest", "smallest"), ("big", "small"),
    ("long", "short"), ("longest", "shortest"), ("oldest", "newest"), ("old", "new"),
    ("early", "late"), ("earliest", "latest"), ("legal", "illegal"), ("north", "south"),
    ("east", "west"), ("left", "right"), ("inside", "outside"), ("import", "export"),
    ("arrive", "depart", "leave"), ("arrival", "departure"), ("borrow", "lend"),
    ("send", "receive"), ("push", "pull"), ("upgrade", "downgrade"), ("join", "leave"),
    ("hire", "fire"), ("light", "dark"), ("include", "exclude"), ("show", "hide"),
    ("withdraw", "deposit"), ("income", "expense"), ("profit", "loss"), ("top", "bottom"),
    ("cheaper", "more expensive", "pricier"), ("better", "worse"), ("faster", "slower"),
    ("bigger", "smaller"), ("larger", "smaller"), ("longer", "shorter"), ("older", "younger"),
    ("easier", "harder"), ("easy", "hard", "difficult"), ("soft", "hard"), ("wet", "dry"),
    ("strong", "weak"), ("full", "empty"), ("positive", "negative"), ("above", "below"),
    ("rich", "poor"), ("heavy", "light"), ("thick", "thin"), ("loud", "quiet"),
    ("permanent", "temporary"), ("permanently", "temporarily"), ("rise", "set"),
    ("sunrise", "sunset"), ("public", "private"), ("within", "after", "beyond"),
)  # fmt: skip
_ZH_ANTONYMS = (
    ("安全", "危险"), ("增加", "减少", "降低"), ("提高", "降低"), ("买", "卖"), ("之前", "之后"),
    ("前", "后"), ("最大", "最小"), ("打开", "关闭"), ("开启", "关闭"), ("启用", "禁用"),
    ("添加", "删除"), ("上传", "下载"), ("导入", "导出"), ("开始", "停止", "结束"),
    ("最好", "最差"), ("便宜", "贵"), ("冷", "热"), ("多", "少"), ("高", "低"), ("上涨", "下跌"),
    ("登录", "退出"), ("加密", "解密"), ("安装", "卸载"), ("订阅", "退订"), ("锁定", "解锁"),
    ("允许", "禁止", "拒绝"), ("接受", "拒绝"), ("优点", "缺点"), ("好处", "坏处", "风险"),
    ("合法", "违法"), ("收入", "支出"), ("升级", "降级"), ("发送", "接收"), ("出发", "到达"),
    ("存款", "取款"), ("男性", "女性"), ("最快", "最慢"), ("最早", "最晚"),
    ("解冻", "冷冻", "冻结"), ("绑定", "解绑"), ("充值", "提现"),
)  # fmt: skip
# The two sides of a relation: a question asked by one side is another question when asked by
# the other ("my employee quit without notice" / "I quit without telling my employer"). Each
# side is a tuple of its names (singular: a plural "s" is dropped before matching).
_ROLES: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("employer", "boss"), ("employee",)), (("landlord", "landlady"), ("tenant", "renter")),
    (("buyer", "purchaser"), ("seller", "vendor")),
    (("lender", "creditor"), ("borrower", "debtor")),
    (("teacher", "tutor"), ("student", "pupil")), (("doctor", "physician"), ("patient",)),
    (("sender",), ("recipient", "receiver")), (("host",), ("guest",)),
    (("driver",), ("passenger", "rider")), (("plaintiff",), ("defendant",)),
    (("insurer",), ("policyholder", "insured")), (("coach",), ("player", "athlete")),
    (("client",), ("contractor", "freelancer")),
    (("雇主", "老板", "公司"), ("员工", "雇员")), (("房东",), ("租客", "房客", "租户")),
    (("买家", "买方"), ("卖家", "卖方", "商家")), (("出借人", "债权人"), ("借款人", "债务人")),
    (("老师", "教师"), ("学生",)), (("医生",), ("病人", "患者")),
    (("司机",), ("乘客",)), (("原告",), ("被告",)), (("保险公司",), ("投保人", "被保险人")),
    (("教练",), ("球员", "运动员")), (("甲方",), ("乙方",)),
)  # fmt: skip
# Single Chinese characters (大/小, 上/下 ...) are left to the character comparison: as
# substrings they would fire inside unrelated words (多少, 上海). A broad rewording skips that
# comparison, and its score alone decides there.

# Scope words: "all" vs "one", "my" vs "our", "only" ... change who or how much is meant.
_EN_SCOPE = {"all", "every", "each", "any", "some", "only", "just", "entire", "whole", "both",
             "either", "most", "least", "total", "average", "per", "partial", "full", "always",
             "sometimes", "usually", "everyone", "anyone", "someone", "team", "company", "personal",
             "shared", "public",
             "private", "global", "local", "kids", "children", "adults", "pregnant"}  # fmt: skip
_EN_SCOPE_FOLD = {"every": "all", "each": "all", "entire": "all", "whole": "all", "just": "only",
                  "everyone": "all", "kids": "children"}  # fmt: skip
_ZH_SCOPE = ("所有", "全部", "每个", "每一个", "任何", "一些", "部分", "只", "仅", "整个",
             "总", "平均", "个人", "团队", "公司", "公开", "私有", "儿童", "孩子", "成人",
             "孕妇", "老人")  # fmt: skip

# Words that start a sentence or are always capitalised without naming anything.
_EN_CAPITAL_STOP = {"i", "i'm", "i've", "i'd", "i'll", "ok", "okay", "please", "hi", "hello", "hey",
                    "what", "how", "why", "when", "where", "who", "which", "is", "are", "can",
                    "could", "do", "does", "should", "would", "will", "tell", "explain", "give",
                    "show", "list", "describe", "the", "a", "an", "my", "in", "on", "for", "to",
                    "and", "or", "thanks", "thank", "any", "whats", "hows"}  # fmt: skip
_EN_CAPITAL_STOP |= _EN_DATES

# Units of measure and currencies: "23 kg" and "23 lb", "5 mg" and "5 g", "$500 in euros" and
# "$500 in yen" differ only there, and embeddings barely see it. Each spelling maps to one unit,
# so "kilograms" and "kg" agree. (Chinese units are content characters, compared below.)
_EN_UNITS = {
    "mg": "mg", "milligram": "mg", "milligrams": "mg", "g": "g", "gram": "g", "grams": "g",
    "kg": "kg", "kgs": "kg", "kilo": "kg", "kilos": "kg", "kilogram": "kg", "kilograms": "kg",
    "lb": "lb", "lbs": "lb", "pound": "lb", "pounds": "lb", "oz": "oz", "ounce": "oz",
    "ounces": "oz", "ton": "t", "tons": "t", "tonne": "t", "tonnes": "t", "stone": "st",
    "ml": "ml", "milliliter": "ml", "milliliters": "ml", "millilitre": "ml", "millilitres": "ml",
    "l": "l", "liter": "l", "liters": "l", "litre": "l", "litres": "l", "gallon": "gal",
    "gallons": "gal", "gal": "gal", "quart": "qt", "quarts": "qt", "pint": "pt", "pints": "pt",
    "cup": "cup", "cups": "cup", "teaspoon": "tsp", "teaspoons": "tsp", "tsp": "tsp",
    "tablespoon": "tbsp", "tablespoons": "tbsp", "tbsp": "tbsp",
    "mm": "mm", "millimeter": "mm", "millimeters": "mm", "millimetre": "mm", "millimetres": "mm",
    "cm": "cm", "centimeter": "cm", "centimeters": "cm", "centimetre": "cm", "centimetres": "cm",
    "m": "m", "meter": "m", "meters": "m", "metre": "m", "metres": "m", "km": "km",
    "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km", "mile": "mi",
    "miles": "mi", "mi": "mi", "inch": "in", "inches": "in", "foot": "ft", "feet": "ft",
    "ft": "ft", "yard": "yd", "yards": "yd", "yd": "yd", "acre": "acre", "acres": "acre",
    "hectare": "ha", "hectares": "ha",
    "c": "degc", "celsius": "degc", "centigrade": "degc", "f": "degf", "fahrenheit": "degf",
    "kelvin": "kelvin", "mph": "mph", "kph": "km/h", "km/h": "km/h", "m/s": "m/s",
    "bit": "bit", "bits": "bit", "byte": "byte", "bytes": "byte", "kb": "kb", "mb": "mb",
    "gb": "gb", "tb": "tb", "kilobyte": "kb", "kilobytes": "kb", "megabyte": "mb",
    "megabytes": "mb", "gigabyte": "gb", "gigabytes": "gb", "terabyte": "tb", "terabytes": "tb",
    "kbps": "kbit/s", "mbps": "mbit/s", "gbps": "gbit/s", "mb/s": "mb/s", "gb/s": "gb/s",
    "kb/s": "kb/s", "ms": "ms", "millisecond": "ms", "milliseconds": "ms", "sec": "s",
    "secs": "s", "seconds": "s", "minute": "min", "minutes": "min", "min": "min", "mins": "min",
    "hour": "h", "hours": "h", "hr": "h", "hrs": "h", "h": "h",
    "watt": "w", "watts": "w", "w": "w", "kw": "kw", "kwh": "kwh", "volt": "v", "volts": "v",
    "v": "v", "amp": "a", "amps": "a", "mah": "mah", "calorie": "kcal", "calories": "kcal",
    "kcal": "kcal", "kilojoule": "kj", "kilojoules": "kj", "kj": "kj", "percent": "%", "%": "%",
    "dollar": "usd", "dollars": "usd", "usd": "usd", "$": "usd", "euro": "eur", "euros": "eur",
    "eur": "eur", "€": "eur", "£": "gbp", "gbp": "gbp", "sterling": "gbp", "yen": "jpy",
    "jpy": "jpy", "yuan": "cny", "rmb": "cny", "cny": "cny", "¥": "cny", "rupee": "inr",
    "rupees": "inr", "inr": "inr", "franc": "chf", "francs": "chf", "chf": "chf",
}  # fmt: skip
# One-letter spellings ("180 c", "5 g", "2 l") are units only right after a number; elsewhere
# they are words ("c" the language, "a", "m").
_SHORT_UNITS = {"c", "f", "g", "l", "m", "h", "w", "v"}
_UNIT_TOKEN = re.compile(
    r"(?P<num>\d(?:[\d.,]*\d)?)?\s*°?\s*(?P<unit>[a-z]+/[a-z]+|[a-z]+|[$€£¥%])(?![a-z])"
)

# Who acts: "I owe my roommate" and "my roommate owes me" share their words and their topic
# but not their actor. The first first-person word says whether the user is the subject.
_FIRST_PERSON_SUBJECT = {"i", "we", "i'm", "i've", "i'd", "i'll", "we're", "we've"}
_FIRST_PERSON_OTHER = {"me", "my", "mine", "myself", "us", "our", "ours", "ourselves"}
_FIRST_PERSON_OBJECT = frozenset({"me", "us", "myself", "ourselves"})
_FIRST_PERSON = _FIRST_PERSON_SUBJECT | _FIRST_PERSON_OTHER
# Chinese has one word for "I" and "me" (我); its place says which. Before 的 ("我的") or
# after a verb or a preposition ("房东起诉我", "后车追尾了我", "给我") it is "my"/"me"; at the
# start of a clause ("我要起诉租客", "如果我...") it is "I". Anywhere else it says nothing.
_ZH_OBJECT_BEFORE = frozenset("给让对把被替帮向跟找叫请欠了诉扣罚骗打告害坑催赶逼追辞除炒删拒")
_ZH_CLAUSE_STARTS = ("如果", "要是", "假如", "但是", "可是", "但", "那么", "所以", "因为", "现在")

# The exchanged-pieces search is quadratic in the differing span; past this many tokens a
# reordering is refused outright.
_EXCHANGE_SEARCH_MAX = 64

# Words that join two things symmetrically: "TCP and UDP" asks what "UDP and TCP" asks.
_SYMMETRIC = {"and", "or", "vs", "versus", "&", "和", "与", "跟", "及", "或"}
_ARTICLES = frozenset({"a", "an", "the"})
_TOKEN = re.compile(r"[a-z0-9]+(?:[.'/-][a-z0-9]+)*|[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|&")

# Chinese characters that carry no content for the character comparison (question words,
# particles, pronouns). The rest of a Chinese question must agree character for character.
_ZH_FUNCTION = set(
    "我你他她它们是的了吗呢吧啊呀在有和与及或把被给对于从到这那个些么什如何为哪"
    "谁能会要想请问可以该应得地着过就都也还又很太更最怎样几吗呢嘛哦噢一下里中"
)


@dataclass(frozen=True, slots=True)
class Features:
    """What must agree between a question and a cached one; made once per question."""

    numbers: tuple[str, ...]
    dates: tuple[str, ...]
    entities: tuple[str, ...]
    negations: int
    polarity: tuple[str, ...]  # sides of antonym groups used, "group:side"
    roles: tuple[str, ...]  # sides of a relation named, "relation:side"
    scope: tuple[str, ...]
    zh_content: tuple[str, ...]  # sorted content characters (Chinese only)
    units: tuple[str, ...]
    code: tuple[str, ...]  # code blocks and inline code, whitespace folded
    operators: tuple[str, ...]  # "==", "<", "//", "++" ... outside code, in order
    symbols: tuple[str, ...]  # emoji and other symbol characters, sorted
    actor: str  # "self" when the first first-person word is a subject, "other", or ""
    tokens: tuple[str, ...]  # words and CJK characters in order, for the order guard
    words: frozenset[str]
    negated_stems: frozenset[str]  # "unsafe" -> "safe", to catch flips across the two questions


def _zh_number(text: str) -> str:
    """'二十三' -> '23', '两千五百' -> '2500', '一九九八' -> '1998'."""
    if all(ch in _ZH_DIGITS for ch in text):
        return str(int("".join(str(_ZH_DIGITS[ch]) for ch in text)))
    total = section = digit = 0
    for ch in text:
        if ch in _ZH_DIGITS:
            digit = _ZH_DIGITS[ch]
        elif ch in ("万", "亿"):
            total += (section + digit) * _ZH_UNITS[ch]
            section = digit = 0
        else:
            section += (digit or 1) * _ZH_UNITS[ch]
            digit = 0
    return str(total + section + digit)


def _strip_idioms(text: str, idioms: tuple[str, ...]) -> str:
    for idiom in idioms:
        text = text.replace(idiom, " ")
    return text


# Code and operators: the words of "what does a / b do" and "what does a // b do" are the same,
# and so are those of a snippet that fails and the one that is fixed; their answers are not.
_OPERATOR = re.compile(r"[-=<>!/*+%&|^~\\#]+")


def _code(text: str) -> tuple[str, ...]:
    """Code blocks and inline code spans, compared as written (only spacing folded)."""
    return tuple(" ".join(m.group().strip("`").split()) for m in CODE_SPAN.finditer(text))


def _operators(text: str) -> tuple[str, ...]:
    """Operator runs outside code, in order. A hyphen or slash inside a word ("e-mail",
    "and/or") and a sentence's "!" are prose, not operators."""
    prose = CODE_SPAN.sub(" ", text)
    found = []
    for match in _OPERATOR.finditer(prose):
        op = match.group()
        before = prose[match.start() - 1 : match.start()]
        after = prose[match.end() : match.end() + 1]
        if op in ("-", "/") and before.isalnum() and after.isalnum():
            continue
        if op == "!" or (op == "-" and before == " " and after == " "):
            continue  # "Help!", "Paris - is it safe?"
        if op == "%" and before.isdigit():
            continue  # "15%" is "15 percent", the units' business
        found.append(op)
    return tuple(found)


def _symbols(text: str) -> tuple[str, ...]:
    """Emoji and other symbol characters (Unicode "So"): the model reads 🙂 and 🙁 alike."""
    if text.isascii():
        return ()
    return tuple(sorted({ch for ch in text if unicodedata.category(ch) == "So"}))


def _units(text: str) -> tuple[str, ...]:
    found: set[str] = set()
    for match in _UNIT_TOKEN.finditer(text):
        unit = match.group("unit")
        if unit in _SHORT_UNITS and match.group("num") is None:
            continue
        if unit in _EN_UNITS:
            found.add(_EN_UNITS[unit])
    return tuple(sorted(found))


def _actor(text: str, words: list[str]) -> str:
    """Whether the user is the subject ("self"), named otherwise ("other"), or neither ("");
    ``text`` as the user wrote it (canonical() drops the 的 and 了 that tell)."""
    for word in words:
        if word in _FIRST_PERSON_SUBJECT:
            return "self"
        if word in _FIRST_PERSON_OTHER:
            return "other"
    first = text.find("我")
    if first < 0:
        return ""
    # The first 我 decides, as the first English first-person word does.
    before = text[:first].rstrip()
    if text[first + 1 : first + 2] == "的" or (before and before[-1] in _ZH_OBJECT_BEFORE):
        return "other"
    if not before or not has_cjk(before[-1]) or before.endswith(_ZH_CLAUSE_STARTS):
        return "self"
    return ""


def _object_moved(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Behind a frame both questions share and that names the user ("what should I do if"),
    the user is the object on one side only: "... if my dog bit someone" / "... if someone's
    dog bit me", "... if I hit someone" / "... if someone hit me". The first first-person
    word, the frame's, cannot tell these apart."""
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    if not any(t in _FIRST_PERSON for t in a[:shared]):
        return False
    rest_a, rest_b = a[shared:], b[shared:]
    object_a = any(t in _FIRST_PERSON_OBJECT for t in rest_a)
    object_b = any(t in _FIRST_PERSON_OBJECT for t in rest_b)
    if object_a == object_b:
        return False
    # The other side names the user too, as subject or owner: the user changed places.
    other = rest_b if object_a else rest_a
    return any(t in _FIRST_PERSON for t in other)


def _exchanged(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether ``b`` is ``a`` with two separated pieces exchanged: "X than Y" -> "Y than X",
    "from X to Y" -> "from Y to X". Such a question asks the opposite, though every word is the
    same. Adjacent pieces exchanged ("in Python, how do I sort" / "how do I sort, in Python")
    and pieces around a symmetric word ("TCP and UDP") ask the same thing."""
    if a == b or len(a) != len(b) or sorted(a) != sorted(b):
        return False
    start = 0
    while a[start] == b[start]:
        start += 1
    end = len(a)
    while a[end - 1] == b[end - 1]:
        end -= 1
    ma, mb = a[start:end], b[start:end]
    n = len(ma)
    if n > _EXCHANGE_SEARCH_MAX:
        return True  # too long to search cheaply: a reordered long text is a miss, not a risk
    for p in range(1, n - 1):
        for q in range(1, n - p):
            middle = ma[p : n - q]
            if mb == ma[n - q :] + middle + ma[:p]:
                return not set(middle) <= _SYMMETRIC
    return False


def _numbers(text: str, words: list[str]) -> tuple[str, ...]:
    found = [n.replace(",", "") for n in _NUMBER.findall(text)]
    found += [_EN_NUMBERS[w] for w in words if w in _EN_NUMBERS]
    if has_cjk(text):
        zh = _strip_idioms(text, _ZH_NUMERAL_IDIOMS)
        found += [_zh_number(m) for m in _ZH_NUMERAL.findall(zh)]
    return tuple(sorted(found))


def _entities(original: str, words: list[str]) -> tuple[str, ...]:
    """Capitalised words after the first word, words mixing letters and digits or inner capitals
    (iPhone, GPT4, macOS), and Latin words inside Chinese text."""
    found: set[str] = set()
    # Once per text, not per word: a 100k-character question is read in one pass.
    cjk = has_cjk(original)
    for i, match in enumerate(_RAW_WORD.finditer(original)):
        word = match.group(0)
        low = word.lower()
        if low in _EN_CAPITAL_STOP or low.removesuffix("s") in _EN_DATES:
            continue
        starts_sentence = i == 0 or _char_before(original, match.start()) in (".", "?", "!", ":")
        inner_capital = any(c.isupper() for c in word[1:])
        mixed = any(c.isdigit() for c in word)
        if (word[0].isupper() and not starts_sentence) or inner_capital or mixed or cjk:
            found.add(low)
    return tuple(sorted(found))


def _char_before(text: str, end: int) -> str:
    """The last non-space character of ``text[:end]``, "" when none."""
    i = end - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return text[i] if i >= 0 else ""


def _polarity(text: str, words: list[str], groups: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    found: set[str] = set()
    padded = f" {' '.join(words)} "
    for gi, group in enumerate(groups):
        for member in group:
            hit = member in text if has_cjk(member) else f" {member} " in padded
            if hit:
                # The first member is one side, the rest the other: "dangerous" and "risky" say
                # one thing, "safe" the opposite.
                found.add(f"{gi}:{0 if member == group[0] else 1}")
    return tuple(sorted(found))


def _roles(text: str, words: list[str]) -> tuple[str, ...]:
    singular = {w.removesuffix("s") for w in words} | set(words)
    found: set[str] = set()
    for ri, relation in enumerate(_ROLES):
        for si, names in enumerate(relation):
            if any((n in text) if has_cjk(n) else (n in singular) for n in names):
                found.add(f"{ri}:{si}")
    return tuple(sorted(found))


def _negations(text: str, words: list[str]) -> int:
    count = sum(1 for w in words if w in _EN_NEGATIONS or w.endswith("n't"))
    if has_cjk(text):
        zh = _strip_idioms(text, _ZH_NEG_IDIOMS)
        count += sum(zh.count(ch) for ch in _ZH_NEGATIONS)
    return count


def _prefix_negated(words: list[str]) -> frozenset[str]:
    """Stems of prefix-negated words ('unsafe' -> 'safe'), to catch flips across questions."""
    return frozenset(
        w[len(p) :] for w in words for p in _NEG_PREFIXES if w.startswith(p) and len(w) > len(p) + 3
    )


def features(text: str) -> Features:
    """Extract everything the guards compare from one question (raw, as the user wrote it)."""
    canon = canonical(text)
    # "everyone's salaries" names everyone: a possessive is its word.
    words = [w.removesuffix("'s") for w in _WORD.findall(canon)]
    cjk = has_cjk(canon)
    scope = sorted({_EN_SCOPE_FOLD.get(w, w) for w in words if w in _EN_SCOPE})
    if cjk:
        scope += sorted(s for s in _ZH_SCOPE if s in canon)
    # "weekends", "mondays": the plural names the same days.
    dates = sorted(
        {
            w.removesuffix("s") if w.removesuffix("s") in _EN_DATES else w
            for w in words
            if w in _EN_DATES or w.removesuffix("s") in _EN_DATES
        }
    )
    zh_content: tuple[str, ...] = ()
    if cjk:
        dates += sorted(d for d in _ZH_DATES if d in canon)
        # Numeral characters are compared as numbers above ("二十三" == "23").
        zh_content = tuple(
            sorted(
                {
                    ch
                    for ch in canon
                    if has_cjk(ch)
                    and ch not in _ZH_FUNCTION
                    and ch not in _ZH_DIGITS
                    and ch not in _ZH_UNITS
                }
            )
        )
    return Features(
        numbers=_numbers(canon, words),
        dates=tuple(dates),
        entities=_entities(text, words),
        negations=_negations(canon, words),
        polarity=_polarity(canon, words, _EN_ANTONYMS + _ZH_ANTONYMS),
        roles=_roles(canon, words),
        scope=tuple(scope),
        zh_content=zh_content,
        units=_units(canon),
        code=_code(text),
        operators=_operators(text),
        symbols=_symbols(text),
        actor=_actor(text, words),
        # "the landlord's permission" / "the tenant's permission": an article or a possessive
        # does not change who is named where.
        tokens=tuple(t.removesuffix("'s") for t in _TOKEN.findall(canon) if t not in _ARTICLES),
        words=frozenset(words),
        negated_stems=_prefix_negated(words),
    )


def _polarity_conflict(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Both questions use a member of the same antonym group, and not the same members.
    (One side naming "safe" and the other nothing is left to the similarity threshold.)"""
    groups_a: dict[str, set[str]] = {}
    groups_b: dict[str, set[str]] = {}
    for item in a:
        group, member = item.split(":", 1)
        groups_a.setdefault(group, set()).add(member)
    for item in b:
        group, member = item.split(":", 1)
        groups_b.setdefault(group, set()).add(member)
    return any(groups_b.get(g, members) != members for g, members in groups_a.items())


def _unnamed(names: tuple[str, ...], other: Features) -> set[str]:
    """The names of one question the other does not name at all, in any case: "Python" and
    "python" are one word typed twice, "Paris" and "London" two places."""
    return {n for n in names if n not in other.words and n not in other.entities}


def _differ(a: tuple[str, ...], b: tuple[str, ...], reworded: bool) -> bool:
    """Whether the values of one slot differ. In a broad rewording a value named on one side
    only is how that side put the question ("two weeks" / "a 14-day trip", "every day" /
    "daily"), so only values named on both sides and differing count there."""
    if reworded and not (a and b):
        return False
    return a != b


def disagreement(a: Features, b: Features, *, reworded: bool = False) -> str | None:
    """The first guard that differs between two questions, or None when all agree.

    ``reworded``: the two questions are a broad rewording of each other, not an edit of one
    span (workers/cache/verify.py decides). Numbers, dates, units, names, code and operators
    then veto only when both questions name some and they differ, and Chinese content
    characters are not compared (a rewording replaces most of them); negation, antonyms, scope,
    who acts and exchanged pieces veto as always (a role swap is often a rewording: "my
    landlord is suing me" / "I am suing my tenant"). Emoji veto only when both sides have some.
    """
    if _differ(a.numbers, b.numbers, reworded):
        return "numbers"
    if _differ(a.dates, b.dates, reworded):
        return "dates"
    one_sided = not (a.entities and b.entities)
    if not (reworded and one_sided) and (_unnamed(a.entities, b) or _unnamed(b.entities, a)):
        return "entities"
    if a.negations % 2 != b.negations % 2:
        return "negation"
    if _polarity_conflict(a.polarity, b.polarity):
        return "antonym"
    if (a.negated_stems & b.words) or (b.negated_stems & a.words):
        return "negation_prefix"
    if a.scope != b.scope:
        return "scope"
    if not reworded and a.zh_content != b.zh_content:
        return "zh_content"
    if _differ(a.units, b.units, reworded):
        return "units"
    if _differ(a.code, b.code, reworded):
        return "code"
    if _differ(a.operators, b.operators, reworded):
        return "operators"
    # An emoji added for tone ("thanks 🙏") changes nothing; one emoji for another does.
    if a.symbols and b.symbols and a.symbols != b.symbols:
        return "symbols"
    if (a.actor and b.actor and a.actor != b.actor) or _object_moved(a.tokens, b.tokens):
        return "actor"
    if _polarity_conflict(a.roles, b.roles):
        return "role"
    if _exchanged(a.tokens, b.tokens):
        return "order"
    return None
