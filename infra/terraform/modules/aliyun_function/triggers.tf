resource "alicloud_fcv3_trigger" "http" {
  count = local.create ? 1 : 0

  function_name = alicloud_fcv3_function.this[0].function_name
  trigger_name  = "spillway-http"
  trigger_type  = "http"
  qualifier     = var.qualifier
  description   = "Inference and health over the KServe v2 protocol (authenticated)"
  trigger_config = jsonencode({
    authType           = var.http_auth_type
    methods            = ["GET", "POST", "HEAD"]
    disableURLInternet = var.disable_url_internet
  })

  depends_on = [alicloud_fcv3_concurrency_config.this]
}

resource "alicloud_fcv3_trigger" "warmup" {
  count = local.create ? var.warmup_pings : 0

  function_name = alicloud_fcv3_function.this[0].function_name
  trigger_name  = "spillway-warmup-${count.index}"
  trigger_type  = "timer"
  qualifier     = var.qualifier
  description   = "Spillway warm-up ping ${count.index + 1} of ${var.warmup_pings}"
  trigger_config = jsonencode({
    cronExpression = var.warmup_cron_expression
    enable         = true
    payload        = local.warmup_payload
  })
}
