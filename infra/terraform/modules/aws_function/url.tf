resource "aws_lambda_function_url" "this" {
  count = local.create && var.create_function_url ? 1 : 0

  function_name      = aws_lambda_function.this[0].function_name
  qualifier          = local.qualifier
  authorization_type = var.function_url_authorization_type
  invoke_mode        = "BUFFERED"

  lifecycle {
    precondition {
      condition     = var.function_url_authorization_type == "AWS_IAM" || var.signing_key_secret_arn != null
      error_message = "function_url_authorization_type = \"NONE\" opens the URL to anyone: set signing_key_secret_arn so every request must carry a valid X-Spillway-Signature."
    }
  }

  depends_on = [aws_lambda_alias.this]
}

resource "aws_lambda_permission" "public_url" {
  count = local.create && var.create_function_url && local.public_url ? 1 : 0
  #checkov:skip=CKV_AWS_301:Only with function_url_authorization_type = NONE, which a precondition ties to a mandatory signing secret.

  statement_id           = "SpillwayPublicUrlSignedRequestsOnly"
  action                 = "lambda:InvokeFunctionUrl"
  function_name          = aws_lambda_function.this[0].function_name
  qualifier              = local.qualifier
  principal              = "*"
  function_url_auth_type = "NONE"

  depends_on = [aws_lambda_function_url.this]
}

resource "aws_lambda_permission" "invoke_url" {
  for_each = local.create && var.create_function_url && !local.public_url ? local.invoker_principal : {}

  statement_id           = "SpillwayUrl-${each.key}"
  action                 = "lambda:InvokeFunctionUrl"
  function_name          = aws_lambda_function.this[0].function_name
  qualifier              = local.qualifier
  principal              = each.value
  function_url_auth_type = "AWS_IAM"

  depends_on = [aws_lambda_alias.this]
}

resource "aws_lambda_permission" "invoke" {
  for_each = local.create ? local.invoker_principal : {}

  statement_id  = "SpillwayInvoke-${each.key}"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this[0].function_name
  qualifier     = local.qualifier
  principal     = each.value

  depends_on = [aws_lambda_alias.this]
}
