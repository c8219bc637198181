data "aws_iam_policy_document" "assume_scheduler" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["scheduler.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

data "aws_iam_policy_document" "scheduler" {
  count = local.create_schedules ? 1 : 0

  statement {
    sid       = "InvokeThisFunctionOnly"
    actions   = ["lambda:InvokeFunction"]
    resources = [local.invoke_arn]
  }
}

resource "aws_iam_role" "scheduler" {
  count = local.create_schedules ? 1 : 0

  name               = "${var.name}-warmup"
  assume_role_policy = data.aws_iam_policy_document.assume_scheduler.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "scheduler" {
  count = local.create_schedules ? 1 : 0

  name   = "spillway-warmup"
  role   = aws_iam_role.scheduler[0].id
  policy = data.aws_iam_policy_document.scheduler[0].json
}

resource "aws_scheduler_schedule" "this" {
  count = local.create_schedules ? var.warmup_pings : 0

  name                         = "${var.name}-warmup-${count.index}"
  description                  = "Spillway warm-up ping ${count.index + 1} of ${var.warmup_pings}"
  schedule_expression          = var.warmup_schedule_expression
  schedule_expression_timezone = "UTC"
  state                        = "ENABLED"
  kms_key_arn                  = var.scheduler_kms_key_arn

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = local.invoke_arn
    role_arn = aws_iam_role.scheduler[0].arn
    input    = local.warmup_payload

    retry_policy {
      maximum_retry_attempts       = 0
      maximum_event_age_in_seconds = 60
    }
  }

  depends_on = [aws_iam_role_policy.scheduler]
}

# EventBridge Scheduler invokes the function asynchronously, and Lambda retries a failed
# asynchronous invocation twice by default and keeps a throttled one queued for up to six hours.
# A ping is worth only its tick: no retry, and dropped after a minute in the queue.
resource "aws_lambda_function_event_invoke_config" "this" {
  count = local.create_schedules ? 1 : 0

  function_name                = aws_lambda_function.this[0].function_name
  qualifier                    = local.qualifier
  maximum_retry_attempts       = 0
  maximum_event_age_in_seconds = 60

  depends_on = [aws_lambda_alias.this]
}
