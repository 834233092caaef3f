"""A stub of Alipay's OpenAPI gateway for one test of timeoutd's `alipay` provider, on 127.0.0.1
only, on a free port it prints as the first line of stdout.

Every signature is made and checked by Alipay's own Python SDK (PyPI `alipay-sdk-python`,
`alipay.aop.api.util.SignatureUtils`), never by code of ours: a request is believed only when
the SDK verifies its `sign` with the app's public key over the parameters Alipay documents
(sorted, without `sign` and empty values, as the SDK's `get_sign_content` joins them), and every
answer and notification is signed by the SDK with "Alipay's" private key. Trades live in memory.

    stub.py APP_ID APP_PUBLIC_KEY_FILE ALIPAY_PRIVATE_KEY_FILE FORGER_PRIVATE_KEY_FILE

The gateway: POST /gateway.do (`alipay.trade.query`, `.close`, `.refund`).
Test-only routes (JSON):
- POST /_test/trades {"out_trade_no", "total_amount", "scanned"}: a pre-order
  (`alipay.trade.precreate`); until the buyer scans its code Alipay has no trade
  (ACQ.TRADE_NOT_EXIST), as for real face-to-face payment;
- POST /_test/pay {"out_trade_no"}: the buyer scans and pays (TRADE_SUCCESS);
- GET /_test/trades/{out_trade_no}: the trade as the stub holds it (status, refunds, closes);
- GET /_test/log: every gateway request (method, whether its signature verified, biz_content);
- POST /_test/tamper {"times"}: the next answers are altered after signing (WAIT_BUYER_PAY
  becomes TRADE_SUCCESS, TRADE_NOT_EXIST becomes TRADE_STATUS_ERROR);
- POST /_test/notice {"out_trade_no", "set"?, "signer"? ("alipay" | "forger"), "url"?}: the
  asynchronous notification of the trade's payment, with `set` applied before signing, signed
  by the SDK; returned as {"params"}, and POSTed as a form to `url` when given ({"status",
  "body"} of that answer).
"""
import datetime
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from alipay.aop.api.util.SignatureUtils import get_sign_content, sign_with_rsa2, verify_with_rsa

APP_ID, APP_PUBLIC, ALIPAY_PRIVATE, FORGER_PRIVATE = (
    sys.argv[1],
    open(sys.argv[2]).read(),
    open(sys.argv[3]).read(),
    open(sys.argv[4]).read(),
)
SELLER_ID = "2088102176073460"
SHANGHAI = datetime.timezone(datetime.timedelta(hours=8))
lock = threading.Lock()
trades = {}
log = []
tamper = {"times": 0}


def shanghai_now():
    return datetime.datetime.now(SHANGHAI).strftime("%Y-%m-%d %H:%M:%S")


def signed_answer(method, obj, key=None):
    """The answer's body: the response object as JSON text (with spaces and Chinese, as
    Alipay's own answers carry them) and the SDK's RSA2 signature of exactly that text."""
    content = json.dumps(obj, ensure_ascii=False)
    sign = sign_with_rsa2(key or ALIPAY_PRIVATE, content, "utf-8")
    with lock:
        if tamper["times"] > 0:
            tamper["times"] -= 1
            content = content.replace("WAIT_BUYER_PAY", "TRADE_SUCCESS").replace(
                "ACQ.TRADE_NOT_EXIST", "ACQ.TRADE_STATUS_ERROR"
            )
    name = method.replace(".", "_") + "_response"
    return '{"%s":%s,"sign":"%s"}' % (name, content, sign)


def error(sub_code, sub_msg, code="40004", msg="Business Failed"):
    return {"code": code, "msg": msg, "sub_code": sub_code, "sub_msg": sub_msg}


def ok(**fields):
    return dict({"code": "10000", "msg": "Success"}, **fields)


def gateway(params):
    """The answer object of one verified request."""
    method = params.get("method", "")
    biz = json.loads(params.get("biz_content") or "{}")
    no = biz.get("out_trade_no")
    with lock:
        trade = trades.get(no)
        if trade is None or not trade["scanned"]:
            return error("ACQ.TRADE_NOT_EXIST", "交易不存在")
        common = {"trade_no": trade["trade_no"], "out_trade_no": no}
        if method == "alipay.trade.query":
            answer = ok(
                **common,
                buyer_logon_id="159****5620",
                trade_status=trade["status"],
                total_amount=trade["total_amount"],
                buyer_pay_amount="0.00",
                store_name="中关村店",
                buyer_user_id="2088101117955611",
            )
            if trade["paid_at"]:
                answer["send_pay_date"] = trade["paid_at"]
                answer["receipt_amount"] = trade["total_amount"]
            return answer
        if method == "alipay.trade.close":
            if trade["status"] != "WAIT_BUYER_PAY":
                return error("ACQ.TRADE_STATUS_ERROR", "交易状态不合法")
            trade["status"] = "TRADE_CLOSED"
            trade["closes"] += 1
            return ok(**common)
        if method == "alipay.trade.refund":
            request_no = biz.get("out_request_no")
            amount = biz.get("refund_amount")
            if not request_no or not amount:
                return error("ACQ.INVALID_PARAMETER", "参数无效", code="40002", msg="Invalid Arguments")
            done = trade["refunds"].get(request_no)
            if done is not None:
                if done != amount:
                    return error("ACQ.REFUND_AMT_NOT_EQUAL_TOTAL", "退款金额与退款请求号不一致")
                return ok(**common, buyer_logon_id="159****5620", fund_change="N", refund_fee=amount)
            if trade["status"] != "TRADE_SUCCESS":
                return error("ACQ.TRADE_STATUS_ERROR", "交易状态不合法")
            if amount != trade["total_amount"]:
                return error("ACQ.REFUND_AMT_RESTRICTION", "退款金额超限")
            trade["refunds"][request_no] = amount
            trade["status"] = "TRADE_CLOSED"
            return ok(
                **common,
                buyer_logon_id="159****5620",
                fund_change="Y",
                refund_fee=amount,
                gmt_refund_pay=shanghai_now(),
            )
    return error("isv.invalid-method", "不存在的方法名", code="40002", msg="Invalid Arguments")


def verify_request(params):
    """Why the SDK refuses the request, or None: the signature over the sorted parameters
    without `sign` and the empty ones, the app, RSA2, UTF-8, a Shanghai timestamp near now."""
    sign = params.get("sign", "")
    content = get_sign_content({k: v for k, v in params.items() if k != "sign" and v != ""})
    try:
        verified = verify_with_rsa(APP_PUBLIC, content.encode("utf-8"), sign)
    except Exception:
        verified = False
    if not verified:
        return "isv.invalid-signature"
    if params.get("app_id") != APP_ID:
        return "isv.invalid-app-id"
    if params.get("sign_type") != "RSA2" or params.get("charset") != "utf-8":
        return "isv.invalid-signature-type"
    if params.get("version") != "1.0":
        return "isv.invalid-version"
    try:
        stamp = datetime.datetime.strptime(params.get("timestamp", ""), "%Y-%m-%d %H:%M:%S")
        skew = abs(stamp.replace(tzinfo=SHANGHAI).timestamp() - time.time())
    except ValueError:
        return "isv.invalid-timestamp"
    if skew > 600:
        return "isv.invalid-timestamp"
    return None


def notice(no, overrides, signer):
    with lock:
        trade = trades[no]
        params = {
            "gmt_create": trade["created"],
            "charset": "utf-8",
            "seller_email": "mall@example.com",
            "subject": "mall 订单 & 商品",
            "buyer_id": "2088102177846880",
            "invoice_amount": trade["total_amount"],
            "notify_id": "2026%010d" % int(time.time()),
            "fund_bill_list": json.dumps([{"amount": trade["total_amount"], "fundChannel": "ALIPAYACCOUNT"}]),
            "notify_type": "trade_status_sync",
            "trade_status": "TRADE_SUCCESS",
            "receipt_amount": trade["total_amount"],
            "app_id": APP_ID,
            "buyer_pay_amount": trade["total_amount"],
            "seller_id": SELLER_ID,
            "gmt_payment": trade["paid_at"] or shanghai_now(),
            "notify_time": shanghai_now(),
            "version": "1.0",
            "out_trade_no": no,
            "total_amount": trade["total_amount"],
            "trade_no": trade["trade_no"],
            "auth_app_id": APP_ID,
            "buyer_logon_id": "159****5620",
            "point_amount": "0.00",
        }
    params.update(overrides)
    content = get_sign_content({k: v for k, v in params.items() if k not in ("sign", "sign_type") and v != ""})
    key = FORGER_PRIVATE if signer == "forger" else ALIPAY_PRIVATE
    params["sign_type"] = "RSA2"
    params["sign"] = sign_with_rsa2(key, content, "utf-8")
    return params


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json;charset=utf-8"):
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        if path == "/_test/log":
            with lock:
                return self.reply(200, json.dumps(log, ensure_ascii=False))
        if path.startswith("/_test/trades/"):
            with lock:
                trade = trades.get(urllib.parse.unquote(path[len("/_test/trades/"):]))
                return self.reply(200 if trade else 404, json.dumps(trade, ensure_ascii=False))
        self.reply(404, "{}")

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        raw = self.body()
        if url.path == "/gateway.do":
            params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
            params.update(urllib.parse.parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
            method = params.get("method", "")
            refused = verify_request(params)
            with lock:
                log.append({"method": method, "verified": refused is None, "refused": refused,
                            "biz_content": params.get("biz_content")})
            if refused:
                answer = error(refused, "请求被拒绝", code="40002", msg="Invalid Arguments")
            else:
                answer = gateway(params)
            return self.reply(200, signed_answer(method, answer), "text/html;charset=utf-8")
        args = json.loads(raw or b"{}")
        if url.path == "/_test/trades":
            no = args["out_trade_no"]
            with lock:
                trades[no] = {
                    "out_trade_no": no,
                    "trade_no": "2026%016d" % (len(trades) + 1),
                    "total_amount": args["total_amount"],
                    "status": "WAIT_BUYER_PAY",
                    "scanned": bool(args.get("scanned", True)),
                    "created": shanghai_now(),
                    "paid_at": None,
                    "refunds": {},
                    "closes": 0,
                }
            return self.reply(200, json.dumps(trades[no], ensure_ascii=False))
        if url.path == "/_test/pay":
            with lock:
                trade = trades[args["out_trade_no"]]
                if trade["status"] != "WAIT_BUYER_PAY":
                    return self.reply(409, json.dumps(trade, ensure_ascii=False))
                trade.update(scanned=True, status="TRADE_SUCCESS", paid_at=shanghai_now())
                return self.reply(200, json.dumps(trade, ensure_ascii=False))
        if url.path == "/_test/tamper":
            with lock:
                tamper["times"] = int(args.get("times", 1))
            return self.reply(200, "{}")
        if url.path == "/_test/notice":
            params = notice(args["out_trade_no"], args.get("set") or {}, args.get("signer", "alipay"))
            answer = {"params": params}
            if args.get("url"):
                request = urllib.request.Request(
                    args["url"],
                    data=urllib.parse.urlencode(params).encode("utf-8"),
                    headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=20) as r:
                        answer.update(status=r.status, body=r.read().decode("utf-8"))
                except urllib.error.HTTPError as e:
                    answer.update(status=e.code, body=e.read().decode("utf-8"))
            return self.reply(200, json.dumps(answer, ensure_ascii=False))
        self.reply(404, "{}")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
