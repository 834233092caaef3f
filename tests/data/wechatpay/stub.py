"""A stub of WeChat Pay API v3 for one test of timeoutd's `wechatpay` provider, on 127.0.0.1
only, on a free port it prints as the first line of stdout.

Every signature is made and checked by WeChat Pay's Python SDK (PyPI `wechatpayv3`), never by
code of ours:
- a request is believed only when its `Authorization` signature equals the one the SDK's
  `build_authorization` makes with the merchant's key for the same method, URL, body, timestamp
  and nonce (SHA256withRSA PKCS#1 v1.5 is deterministic, so equal signatures mean the same
  signed text: a canonicalization mistake on timeoutd's side fails here);
- every answer and notification is signed by the SDK (`Core.sign`) with the platform's key;
- a notification's resource is encrypted with AES-256-GCM by `cryptography` (the library the SDK
  decrypts with), then checked by the SDK's own `Core.decrypt_callback`, as a merchant using the
  SDK would receive it, before it is sent.
Transactions live in memory.

    stub.py MCHID APPID MERCHANT_SERIAL MERCHANT_KEY PLATFORM_KEY PLATFORM_PUB PLATFORM_KEY_ID \
            APIV3_KEY_FILE FORGER_KEY

The API: GET /v3/pay/transactions/out-trade-no/{no}?mchid=, POST …/{no}/close,
POST /v3/refund/domestic/refunds.
Test-only routes (JSON):
- POST /_test/transactions {"out_trade_no", "total"}: a pre-order (NOTPAY);
- POST /_test/pay {"out_trade_no"}: the buyer pays (SUCCESS);
- GET /_test/transactions/{no}: the transaction as the stub holds it (state, closes, refunds);
- GET /_test/log: every API request (method, path, whether the SDK verified it, body);
- POST /_test/notice {"out_trade_no", "set"?, "signer"? ("platform" | "forger"), "age"? (seconds
  the timestamp is back-dated), "url"?}: the TRANSACTION.SUCCESS notification, `set` applied to
  its resource before encryption; returned as {"headers", "notice"}, and POSTed to `url` when
  given ({"status", "body"} of that answer).
"""
import base64
import json
import sys
import threading
import time
import types
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from wechatpayv3 import utils
from wechatpayv3.core import Core

(MCHID, APPID, MERCHANT_SERIAL, MERCHANT_KEY, PLATFORM_KEY, PLATFORM_PUB, PLATFORM_KEY_ID,
 APIV3_KEY, FORGER_KEY) = [sys.argv[1], sys.argv[2], sys.argv[3]] + [
    open(p).read().strip() for p in sys.argv[4:7]] + [sys.argv[7]] + [
    open(p).read().strip() for p in sys.argv[8:10]]
SHANGHAI = timezone(timedelta(hours=8))


def core(private_key):
    """An SDK core signing with `private_key`, verifying with the platform's public key."""
    return Core(mchid=MCHID, cert_serial_no=MERCHANT_SERIAL, private_key=private_key,
                apiv3_key=APIV3_KEY, public_key=PLATFORM_PUB, public_key_id=PLATFORM_KEY_ID)


PLATFORM = core(PLATFORM_KEY)
FORGER = core(FORGER_KEY)
MERCHANT = core(MERCHANT_KEY)
lock = threading.Lock()
transactions = {}
log = []


def signed_headers(body, signer=PLATFORM, age=0):
    """The Wechatpay-* headers of `body`, signed by the SDK."""
    timestamp = str(int(time.time()) - age)
    nonce = uuid.uuid4().hex
    return {
        "Wechatpay-Timestamp": timestamp,
        "Wechatpay-Nonce": nonce,
        "Wechatpay-Signature": signer.sign([timestamp, nonce, body]),
        "Wechatpay-Serial": PLATFORM_KEY_ID,
        "Wechatpay-Signature-Type": "WECHATPAY2-SHA256-RSA2048",
    }


def verify_request(method, url, body, authorization):
    """Why the request is refused, or None: the SDK's signature for the same request must be
    the one sent."""
    scheme, _, params = authorization.partition(" ")
    if scheme != "WECHATPAY2-SHA256-RSA2048":
        return "SIGN_ERROR"
    fields = {}
    for part in params.split(","):
        key, _, value = part.strip().partition("=")
        fields[key] = value.strip('"')
    if fields.get("mchid") != MCHID or fields.get("serial_no") != MERCHANT_SERIAL:
        return "SIGN_ERROR"
    try:
        stamp = int(fields.get("timestamp", ""))
    except ValueError:
        return "SIGN_ERROR"
    if abs(stamp - time.time()) > 300:
        return "SIGN_ERROR"
    with lock:
        saved = utils.time
        utils.time = types.SimpleNamespace(time=lambda: stamp)
        try:
            expected = utils.build_authorization(url, method, MCHID, MERCHANT_SERIAL,
                                                 MERCHANT._private_key, data=body,
                                                 nonce_str=fields.get("nonce_str"))
        finally:
            utils.time = saved
    if 'signature="%s"' % fields.get("signature") not in expected:
        return "SIGN_ERROR"
    return None


def now_text():
    return datetime.now(SHANGHAI).isoformat(timespec="seconds")


def transaction_view(t):
    view = {
        "appid": APPID, "mchid": MCHID, "out_trade_no": t["out_trade_no"],
        "trade_state": t["trade_state"], "trade_state_desc": "支付成功" if t["trade_state"] == "SUCCESS" else "订单未支付",
        "amount": {"payer_currency": "CNY"},
    }
    if t["trade_state"] in ("SUCCESS", "REFUND"):
        view.update(transaction_id=t["transaction_id"], trade_type="NATIVE", bank_type="OTHERS",
                    attach="", success_time=t["success_time"], payer={"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"})
        view["amount"] = {"total": t["total"], "payer_total": t["total"], "currency": "CNY", "payer_currency": "CNY"}
    return view


def error(status, code, message):
    return status, {"code": code, "message": message}


def api(method, path, body):
    """(status, answer object or None) of one verified request."""
    prefix = "/v3/pay/transactions/out-trade-no/"
    with lock:
        if method == "GET" and path.startswith(prefix):
            no = urllib.parse.unquote(path[len(prefix):])
            t = transactions.get(no)
            if t is None:
                return error(404, "ORDER_NOT_EXIST", "订单不存在")
            return 200, transaction_view(t)
        if method == "POST" and path.startswith(prefix) and path.endswith("/close"):
            no = urllib.parse.unquote(path[len(prefix):-len("/close")])
            if json.loads(body or "{}").get("mchid") != MCHID:
                return error(400, "PARAM_ERROR", "mchid 与商户号不符")
            t = transactions.get(no)
            if t is None:
                return error(404, "ORDER_NOT_EXIST", "订单不存在")
            if t["trade_state"] == "SUCCESS":
                return error(400, "ORDERPAID", "订单已支付")
            if t["trade_state"] != "NOTPAY":
                return error(400, "ORDER_CLOSED", "订单已关闭")
            t["trade_state"] = "CLOSED"
            t["closes"] += 1
            return 204, None
        if method == "POST" and path == "/v3/refund/domestic/refunds":
            args = json.loads(body or "{}")
            t = transactions.get(args.get("out_trade_no"))
            if t is None:
                return error(404, "RESOURCE_NOT_EXISTS", "订单不存在")
            refund_no, amount = args.get("out_refund_no"), args.get("amount") or {}
            if not refund_no or amount.get("currency") != "CNY" or amount.get("total") != t["total"]:
                return error(400, "PARAM_ERROR", "参数错误")
            done = t["refunds"].get(refund_no)
            if done is None:
                if t["trade_state"] != "SUCCESS" or amount.get("refund") != t["total"]:
                    return error(400, "INVALID_REQUEST", "订单状态不正确或退款金额不符")
                t["refunds"][refund_no] = amount["refund"]
                t["trade_state"] = "REFUND"
                status = "PROCESSING"
            elif done != amount.get("refund"):
                return error(400, "INVALID_REQUEST", "退款单号已用于另一金额")
            else:
                status = "SUCCESS"
            return 200, {"refund_id": "50000000382019052709732678859", "out_refund_no": refund_no,
                         "transaction_id": t["transaction_id"], "out_trade_no": t["out_trade_no"],
                         "channel": "ORIGINAL", "user_received_account": "支付用户零钱",
                         "create_time": now_text(), "status": status,
                         "amount": {"refund": amount["refund"], "total": t["total"], "payer_total": t["total"],
                                    "payer_refund": amount["refund"], "currency": "CNY"}}
    return error(404, "NOT_FOUND", "无此接口")


def notice(no, overrides, signer, age):
    """(headers, body) of the TRANSACTION.SUCCESS notification of `no`, as WeChat Pay sends it;
    checked by the SDK as a merchant receives it."""
    with lock:
        resource = transaction_view(transactions[no])
    resource.update(overrides)
    nonce = uuid.uuid4().hex[:12]
    plain = json.dumps(resource, ensure_ascii=False).encode("utf-8")
    ciphertext = AESGCM(APIV3_KEY.encode("utf-8")).encrypt(nonce.encode("utf-8"), plain, b"transaction")
    body = json.dumps({
        "id": str(uuid.uuid4()), "create_time": now_text(), "resource_type": "encrypt-resource",
        "event_type": "TRANSACTION.SUCCESS", "summary": "支付成功",
        "resource": {"original_type": "transaction", "algorithm": "AEAD_AES_256_GCM",
                     "ciphertext": base64.b64encode(ciphertext).decode(), "associated_data": "transaction",
                     "nonce": nonce},
    }, ensure_ascii=False)
    headers = signed_headers(body, FORGER if signer == "forger" else PLATFORM, age)
    if signer != "forger":
        # The SDK, as a merchant's server runs it, verifies and decrypts it.
        assert json.loads(MERCHANT.decrypt_callback(headers, body)) == resource
    return headers, body


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, obj, signed=False):
        data = b"" if obj is None else json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        if obj is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        if signed:
            for k, v in signed_headers(data.decode("utf-8")).items():
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8")

    def handle_api(self, method):
        body = self.body() if method == "POST" else ""
        refused = verify_request(method, self.path, body, self.headers.get("Authorization", ""))
        with lock:
            log.append({"method": method, "path": self.path, "verified": refused is None,
                        "body": json.loads(body) if body else None})
        if refused:
            # Unsigned, as WeChat Pay answers a request it does not believe.
            return self.reply(401, {"code": refused, "message": "签名错误"})
        status, answer = api(method, urllib.parse.urlparse(self.path).path, body)
        self.reply(status, answer, signed=True)

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        if path.startswith("/v3/"):
            return self.handle_api("GET")
        with lock:
            if path == "/_test/log":
                return self.reply(200, log)
            if path.startswith("/_test/transactions/"):
                t = transactions.get(urllib.parse.unquote(path[len("/_test/transactions/"):]))
                return self.reply(200 if t else 404, t)
        self.reply(404, {})

    def do_POST(self):
        path = urllib.parse.urlparse(self.path).path
        if path.startswith("/v3/"):
            return self.handle_api("POST")
        args = json.loads(self.body() or "{}")
        if path == "/_test/transactions":
            no = args["out_trade_no"]
            with lock:
                transactions[no] = {"out_trade_no": no, "total": int(args["total"]),
                                    "transaction_id": "42000%023d" % (len(transactions) + 1),
                                    "trade_state": "NOTPAY", "success_time": None, "closes": 0, "refunds": {}}
                return self.reply(200, transactions[no])
        if path == "/_test/pay":
            with lock:
                t = transactions[args["out_trade_no"]]
                if t["trade_state"] != "NOTPAY":
                    return self.reply(409, t)
                t.update(trade_state="SUCCESS", success_time=now_text())
                return self.reply(200, t)
        if path == "/_test/notice":
            headers, body = notice(args["out_trade_no"], args.get("set") or {},
                                   args.get("signer", "platform"), int(args.get("age", 0)))
            answer = {"headers": headers, "notice": body}
            if args.get("url"):
                request = urllib.request.Request(
                    args["url"], data=body.encode("utf-8"),
                    headers=dict(headers, **{"Content-Type": "application/json"}))
                try:
                    with urllib.request.urlopen(request, timeout=20) as r:
                        answer.update(status=r.status, body=r.read().decode("utf-8"))
                except urllib.error.HTTPError as e:
                    answer.update(status=e.code, body=e.read().decode("utf-8"))
            return self.reply(200, answer)
        self.reply(404, {})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
